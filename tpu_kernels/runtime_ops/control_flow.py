"""Control flow on tpu tensors: ``torch.cond``, ``scan`` and ``map`` (torch's higher-order
ops), eager, in deferred mode and inside compiled graphs.

A higher-order op has rules per mode and per tensor subclass; torch has none for ours, so
this module gives each op three:

- **traced** (Dynamo's and AOTAutograd's fake runs): torch's fake rule asserts the
  branches return FakeTensors. A traced tpu tensor wraps a fake shadow, so the rule runs
  on the shadows and its results are wrapped again (as every op is, ``tensor._run_on_shadows``).
- **real**: outside a compiled program the predicate is read and one branch runs, as
  torch's dense rule does. Inside a compiled graph's trace (``graph_program.py``) the
  predicate is a traced value: the op becomes one ``jax.lax.cond``. Each branch's
  device-side check flags come out of the cond (the other branch's as all-clear), and
  the random ops of both branches draw keys from the same counters, as only one runs.
  ``scan`` and ``map`` run torch's dense rule, a Python loop over the leading dimension:
  in a compiled graph the loop is unrolled into the program (fine for the short loops
  these ops see in models; a long scan makes a long program).
- **autograd, eager**: torch's rules trace the bodies with make_fx first, which cannot
  trace a real tpu tensor; the chosen branch (or the loop) runs under autograd instead.

Both branches of a cond must return tensors of the same shapes and dtypes (torch's rule).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch
from torch._C import DispatchKey
from torch._higher_order_ops.cond import cond_op
from torch._higher_order_ops.map import map_impl
from torch._higher_order_ops.scan import scan_op
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

from tpu_kernels.dispatch import graph_trace
from tpu_kernels.tensor import TpuTensor, wrap
from tpu_kernels.tensor_values import read
_FAKE_RULE = cond_op.python_key_table[FakeTensorMode]


def _traced(t: Any) -> bool:
    return isinstance(t, TpuTensor) and t._tpu_storage is None


def _shadow(t: Any) -> Any:
    return t._tpu_inner if _traced(t) else t


def _any_traced(args: tuple) -> bool:
    return any(_traced(t) for t in tree_leaves(args))


def _on_shadows(rule: Callable, *args: Any) -> Any:
    """``rule`` on the shadows of traced tpu tensors; its tpu results wrapped again."""
    out = rule(*tree_map(_shadow, args))
    return tree_map(lambda o: TpuTensor._traced(o) if isinstance(o, torch.Tensor)
                    and not isinstance(o, TpuTensor) and o.device.type == "tpu" else o, out)


def _fake_rule(mode: FakeTensorMode, pred: Any, true_fn: Callable, false_fn: Callable, operands: tuple) -> Any:
    """torch's fake rule (Dynamo's fake run), on traced tpu tensors' shadows."""
    if not _any_traced((pred, operands)):
        return _FAKE_RULE(mode, pred, true_fn, false_fn, operands)
    return _on_shadows(lambda *a: _FAKE_RULE(mode, *a), pred, true_fn, false_fn, operands)


def _cond_rule(pred: Any, true_fn: Callable, false_fn: Callable, operands: tuple) -> Any:
    """``cond`` on tpu tensors: traced ones (AOTAutograd's trace) through their shadows,
    real ones (or a compiled graph's traced values) run."""
    if _any_traced((pred, operands)):
        return _on_shadows(cond_op, pred, true_fn, false_fn, operands)
    trace = graph_trace.active()
    if not isinstance(pred, torch.Tensor):
        return (true_fn if pred else false_fn)(*operands)
    if trace is None:
        return (true_fn if pred.item() else false_fn)(*operands)
    return _lax_cond(trace, read(pred), true_fn, false_fn, operands)


def _lax_cond(trace: graph_trace.GraphTrace, pred: jax.Array, true_fn: Callable,
              false_fn: Callable, operands: tuple) -> Any:
    """The op as one ``jax.lax.cond`` inside a compiled graph's trace."""
    tensors = [k for k, t in enumerate(operands) if isinstance(t, TpuTensor)]
    base, checks = trace.random_ops, trace.checks
    spec: dict = {}

    def branch(fn: Callable, which: int) -> Callable:
        def run(*arrays: jax.Array) -> tuple:
            ops = list(operands)
            for k, a in zip(tensors, arrays):
                ops[k] = wrap(a, operands[k].dtype)
            trace.random_ops, trace.checks = base, []
            leaves, tree = tree_flatten(fn(*ops))
            spec[which] = (tree, [o.dtype if isinstance(o, torch.Tensor) else None for o in leaves],
                           trace.random_ops, trace.checks)
            outs = [read(o) if isinstance(o, torch.Tensor) else o for o in leaves]
            return outs, [f for f, _, _ in trace.checks]
        return run

    arrays = [read(operands[k]) for k in tensors]
    # each branch once on abstract values: its flags' shapes, so both can return both
    # branches' flags (the other's all clear) and lax.cond sees one output structure
    shapes = [jax.eval_shape(branch(fn, w), *arrays)[1] for w, fn in enumerate((true_fn, false_fn))]

    def padded(fn: Callable, which: int) -> Callable:
        def run(*arrays: jax.Array) -> tuple:
            outs, flags = branch(fn, which)(*arrays)
            clear = [[jnp.zeros(s.shape, s.dtype) for s in shapes[w]] for w in (0, 1)]
            clear[which] = flags
            return outs, clear[0] + clear[1]
        return run

    try:
        outs, flags = jax.lax.cond(jnp.reshape(pred, ()), padded(true_fn, 0), padded(false_fn, 1), *arrays)
    finally:
        trace.checks = checks
    trace.random_ops = max(spec[0][2], spec[1][2])
    for f, (_, op, what) in zip(flags, spec[0][3] + spec[1][3]):
        trace.add_checks(f, op, what)
    tree, dtypes = spec[0][0], spec[0][1]
    return tree_unflatten([wrap(o, d) if d is not None else o for o, d in zip(outs, dtypes)], tree)


def _chosen_branch(pred: Any, true_fn: Callable, false_fn: Callable, operands: tuple) -> Any:
    """Eager cond: the branch the predicate picks, run."""
    if isinstance(pred, torch.Tensor):
        pred = pred.item()
    return (true_fn if pred else false_fn)(*operands)


def _loop_rule(op: Any) -> Callable:
    """``scan``'s or ``map``'s TpuTensor rule: traced tensors through their shadows, real
    ones (or a compiled graph's traced values) through torch's dense loop."""
    dense = op.py_kernels[DispatchKey.CompositeExplicitAutograd]

    def rule(*args: Any) -> Any:
        return _on_shadows(op, *args) if _any_traced(args) else dense(*args)
    return rule


def _autograd_rule(op: Any, eager: Callable) -> Callable:
    """``op``'s rule at tpu's autograd key: on real tensors with grad on, ``eager`` runs
    under autograd; traced tensors, no-grad calls and a compiled graph's trace take
    torch's rule."""
    torch_rule = op.py_kernels[DispatchKey.Autograd]

    def rule(*args: Any) -> Any:
        if not torch.is_grad_enabled() or graph_trace.active() is not None or _any_traced(args):
            return torch_rule(*args)
        leaves, tree = tree_flatten(args)
        at = [k for k, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

        def call(*tensors: torch.Tensor) -> Any:
            for k, t in zip(at, tensors):
                leaves[k] = t
            return eager(*tree_unflatten(leaves, tree))
        box: list = []
        out = _Recorded.apply(call, box, *[leaves[k] for k in at])
        return tree_unflatten(list(out), box[0])
    return rule


class _Recorded(torch.autograd.Function):
    """``fn(*operands)`` run under autograd, its graph kept for the backward. Operands it
    does not reach (a cond's untaken branch's) get zero gradients, not None, as torch's
    rules give them (an optimizer treats the two differently)."""

    @staticmethod
    def forward(ctx, fn: Callable, box: list, *operands: Any) -> tuple:
        ins = [o.detach().requires_grad_(o.requires_grad) for o in operands]
        with torch.enable_grad():
            leaves, tree = tree_flatten(fn(*ins))
        box.append(tree)
        ctx.ins, ctx.outs = ins, leaves
        return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in leaves)

    @staticmethod
    def backward(ctx, *grads: Any) -> tuple:
        pairs = [(o, g) for o, g in zip(ctx.outs, grads)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        wanted = [i for i in ctx.ins if i.requires_grad]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                       allow_unused=True, retain_graph=True)
                   if pairs and wanted else [None] * len(wanted))
        res = []
        for i in ctx.ins:
            g = next(got) if i.requires_grad else None
            res.append(torch.zeros_like(i) if i.requires_grad and g is None else g)
        return (None, None, *res)


cond_op.python_key_table[FakeTensorMode] = _fake_rule
cond_op.py_impl(TpuTensor)(_cond_rule)
cond_op.py_impl(DispatchKey.AutogradPrivateUse1)(_autograd_rule(cond_op, _chosen_branch))
for _op in (scan_op, map_impl):
    _op.py_impl(TpuTensor)(_loop_rule(_op))
    _op.py_impl(DispatchKey.AutogradPrivateUse1)(_autograd_rule(_op, _op.py_kernels[DispatchKey.CompositeExplicitAutograd]))
    _op._dispatch_cache.clear()
cond_op._dispatch_cache.clear()
