"""``torch.tpu.make_graphed_callables``: a module or function whose forward and backward
each replay a captured graph, inside an otherwise eager training loop.

    block = torch.tpu.make_graphed_callables(block, (torch.randn(8, 64, device="tpu"),))
    loss = head(block(x)).sum(); loss.backward()     # the block: two replays

``torch.cuda.make_graphed_callables``' contract and steps. Warm-up runs of each callable
and its gradient; then its forward is captured (``graphs.TPUGraph``), and its backward is
captured as ``torch.autograd.grad`` of the captured outputs with respect to the inputs
that require grad and the module's parameters, given static output gradients. The
backward's capture reads what the forward's capture left in memory (its saved
activations are storages the forward's replay writes), so the two replays chain as the
graphs did. The callable becomes an ``autograd.Function``: forward copies the arguments
into the static inputs and replays the forward graph; backward copies the incoming
gradients into the static gradient outputs, replays the backward graph and returns its
gradients, which autograd accumulates into ``.grad`` as for any op.

As with CUDA: arguments are tensors only, in the shapes of ``sample_args``; a module has
no hooks and no buffers that require grad; the outputs alias static memory that the
next call overwrites; a module in the other training state than at capture runs its
original forward.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from tpu_kernels.graphs import TPUGraph, graph

__all__ = ["make_graphed_callables", "install"]


def _check(fn: Any, args: tuple) -> tuple:
    if isinstance(fn, torch.nn.Module):
        if fn._backward_hooks or fn._forward_hooks or fn._forward_pre_hooks:
            raise RuntimeError("make_graphed_callables: modules must not have hooks registered "
                               "when they are passed (register them after)")
        if any(b.requires_grad for b in fn.buffers()):
            raise RuntimeError("make_graphed_callables: only parameters may be trainable; all "
                               "buffers must have requires_grad=False")
    flat = tuple(pytree.arg_tree_leaves(*args))
    if not all(isinstance(a, torch.Tensor) for a in flat):
        raise TypeError("make_graphed_callables: sample_args must contain only tensors, got "
                        + ", ".join(sorted({type(a).__name__ for a in flat if not isinstance(a, torch.Tensor)})))
    return flat


def _grads(outputs: tuple, surface: tuple, grad_outputs: tuple, allow_unused: bool) -> tuple:
    """Gradients of ``outputs`` (those that require grad) w.r.t. the inputs of ``surface``
    that require grad, given ``grad_outputs``."""
    wanted = [o for o in outputs if o.requires_grad]
    inputs = [i for i in surface if i.requires_grad]
    if not wanted or not inputs:
        return ()
    return torch.autograd.grad(wanted, inputs, grad_outputs=[g for g in grad_outputs if g is not None],
                               only_inputs=True, allow_unused=allow_unused)


class _Captured:
    """One callable's two graphs and the static memory they read and write."""

    def __init__(self, fn: Callable, args: tuple, flat: tuple, warmup: int, allow_unused: bool) -> None:
        params = tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ()
        self.n_args, self.surface = len(flat), flat + params
        for _ in range(warmup):     # lazily made state (an optimizer's, a cache) exists before capture
            outs = tuple(pytree.tree_leaves(fn(*args)))
            _grads(outs, self.surface, tuple(torch.ones_like(o) for o in outs if o.requires_grad), allow_unused)
        self.fwd, self.bwd = TPUGraph(), TPUGraph()
        with graph(self.fwd):
            outs, self.spec = pytree.tree_flatten(fn(*args))
        self.outputs = tuple(outs)
        self.grad_outputs = tuple(torch.empty_like(o) if o.requires_grad else None for o in self.outputs)
        with graph(self.bwd):
            grads = iter(_grads(self.outputs, self.surface, self.grad_outputs, allow_unused))
        self.grad_inputs = tuple(next(grads) if i.requires_grad else None for i in self.surface)

    def function(self) -> Callable:
        """The callable: an ``autograd.Function`` over (flattened arguments, parameters)."""
        cap = self

        class Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                for static, x in zip(cap.surface[:cap.n_args], inputs):
                    if x is not static:
                        static.copy_(x)
                cap.fwd.replay()
                return tuple(o.detach() for o in cap.outputs)

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx, *grads):
                for static, g in zip(cap.grad_outputs, grads):
                    if static is not None and g is not None and g is not static:
                        static.copy_(g)
                cap.bwd.replay()
                return tuple(None if g is None else g.detach() for g in cap.grad_inputs)

        params = cap.surface[cap.n_args:]

        def graphed(*args: Any) -> Any:
            out = Graphed.apply(*pytree.arg_tree_leaves(*args), *params)
            return pytree.tree_unflatten(list(out), cap.spec)
        return graphed


def make_graphed_callables(callables: Any, sample_args: Any, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool: Any = None) -> Any:
    """``torch.cuda.make_graphed_callables`` for tpu (see the module docstring). A tuple
    of callables with a tuple of argument tuples gives a tuple back; ``pool`` is unused."""
    if torch.is_autocast_enabled("tpu") and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast caching: "
                           "use torch.autocast(..., cache_enabled=False)")
    one = not isinstance(callables, tuple)
    fns, all_args = ((callables,), (sample_args,)) if one else (callables, sample_args)
    flats = [_check(fn, args) for fn, args in zip(fns, all_args)]
    results = []
    for fn, args, flat in zip(fns, all_args, flats):
        graphed = _Captured(fn, args, flat, num_warmup_iters, allow_unused_input).function()
        if isinstance(fn, torch.nn.Module):
            fn.forward = _forward_when(fn, fn.training, graphed, fn.forward)
            graphed = fn
        results.append(graphed)
    return results[0] if one else tuple(results)


def _forward_when(module: torch.nn.Module, training: bool, graphed: Callable, original: Callable) -> Callable:
    """The module's forward: the graphed one in the training state it was captured in."""
    def forward(*args: Any) -> Any:
        return graphed(*args) if module.training == training else original(*args)
    return forward


def install() -> None:
    """``torch.tpu.make_graphed_callables``."""
    torch.tpu.make_graphed_callables = make_graphed_callables
