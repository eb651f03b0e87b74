"""A compiled training graph's forward and backward as one program, when its backward is
``loss.backward()``: speculative, checked at the backward, the two programs kept.

Why: a compiled training step runs the forward program, later the backward program, each
a launch with its own arguments and results (the activations the backward reads leave
the forward and come back). Hand-written JAX computes loss and gradients in one program.
When the backward that follows is seeded by ``loss.backward()`` itself (the gradient of a
0-dim output torch makes as ones, no gradient for the other outputs), what it computes is
known at the forward: the joint program runs the forward graph, then the backward graph
with those gradients as constants, and returns the outputs and every input's gradient;
the backward hands back the gradients (``stash``) without running anything.

When: after ``WARMUP`` backwards of the same compiled function took that pattern (seeds,
identified by identity: ``_make_grads`` is wrapped to note the ones it makes, and their
arrays, so a seed written in place is not one), for graphs whose forward writes no input
and runs as one program, without saved-tensors hooks. At the backward the pattern is
checked again: a hit returns the stash; a miss (a gradient from eager code,
``create_graph=True``) runs the forward program again for its saved values (its random
ops, dropout's, drawing what the joint program drew) and then the backward program, as
without this (inputs are saved as before, so an in-place change to one raises as it does
eagerly; one changed that was not saved makes the rerun raise), and turns the joint
program off for that function. ``retain_graph=True`` keeps the stash for the next
backward. ``TPU_KERNELS_COMPILE_JOINT=0`` turns this off (``compile_joint.ON = False``:
from the next call on).

On a TPU v5e (one process, the two ways switched between rounds of 10 steps, median of
steps each waited for): the small GPT's compiled training step 3.60 -> 3.12 ms, the medium's
6.19 -> 5.13 ms (hand-written JAX: 0.95 and 2.72); on 2 CPU cores the small one 3.31 -> 2.77.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Any, Sequence

import torch

from tpu_kernels import compile_step
from tpu_kernels.graph_program import GraphProgram
from tpu_kernels.tensor import TpuTensor

log = logging.getLogger(__name__)
ON = os.environ.get("TPU_KERNELS_COMPILE_JOINT", "1") not in ("", "0")
WARMUP = 2      # backwards of the pattern seen before the joint program is compiled
_seeds = threading.local()   # the seeds torch made for this thread's latest backward


def _noting_seeds(make: Any) -> Any:
    @functools.wraps(make)
    def made(outputs: Any, grads: Any, is_grads_batched: bool) -> tuple:
        new = make(outputs, grads, is_grads_batched)
        _seeds.made = [(m, m._tpu_storage.array) for g, m in zip(grads, new)
                       if g is None and type(m) is TpuTensor and m.dim() == 0]
        return new
    return made


@functools.cache
def install() -> None:
    """Note the seeds torch makes for ``backward()`` and ``autograd.grad`` (once)."""
    torch.autograd._make_grads = _noting_seeds(torch.autograd._make_grads)


def is_seed(g: Any) -> bool:
    """``g`` is a gradient torch made as ones for this backward, unwritten since."""
    return type(g) is TpuTensor and any(
        g is m and g._tpu_storage.array is a for m, a in getattr(_seeds, "made", ()))


class Speculation:
    """One compiled training function's joint program: when to use it, and it."""

    def __init__(self, forward: GraphProgram, backward: GraphProgram, n_out: int,
                 tangents: Sequence[int]) -> None:
        install()
        self.forward, self.backward, self.n_out, self.tangents = forward, backward, n_out, list(tangents)
        self.pattern: tuple[bool, ...] | None = None   # per gradient taken: a seed (else none)
        self.hits = 0
        self.program: GraphProgram | None = None
        self.off = False

    def qualifies(self) -> bool:
        f, b = self.forward, self.backward
        return not (self.off or f.donated or f.host is not None or f.eager
                    or b.eager or f.cpu_outputs or f.cpu_inputs)

    def _pattern(self, grads: Sequence[Any]) -> tuple[bool, ...] | None:
        seeds = tuple(is_seed(grads[i]) for i in self.tangents)
        if not any(seeds) or any(g is not None for i, g in enumerate(grads) if i not in self.tangents):
            return None
        if any(grads[i] is not None for i, s in zip(self.tangents, seeds) if not s):
            return None
        return seeds

    def observe(self, grads: Sequence[Any]) -> None:
        """A backward without the joint program: count the pattern it took (the program,
        once made, keeps the pattern it was made for)."""
        if self.program is not None:
            return
        pattern = None if torch.is_grad_enabled() else self._pattern(grads)
        self.hits = self.hits + 1 if pattern is not None and pattern == self.pattern else int(pattern is not None)
        self.pattern = pattern

    def ready(self) -> bool:
        """Whether this forward runs the joint program."""
        return ON and self.hits >= WARMUP and not self.off and self.qualifies()

    def hit(self, grads: Sequence[Any]) -> bool:
        """Whether the stash is this backward's answer (else: off for good)."""
        if not torch.is_grad_enabled() and self._pattern(grads) == self.pattern:
            return True
        log.info("a compiled training graph's backward was not the one its joint program "
                 "computed: the forward runs again, and from now on separately")
        self.off = True
        return False

    def run(self, args: Sequence[Any]) -> list[Any]:
        """The outputs, then one gradient per input (None where none is needed)."""
        if self.program is None:
            gm = joint_graph(self.forward.gm, self.backward.gm, self.n_out, self.pattern)
            # (a training forward's kind of program: traced with any recording paused,
            # recorded into the step where compile_step defers)
            self.program = compile_step.program_for("forward", gm, list(args), self.forward.options)
            self.program.role = "joint"
            self.forward.joint = self.program     # (found from the forward: tests, benches)
            log.info("a compiled training graph runs its forward and backward as one program")
        return self.program(*args)


def joint_graph(fwd: torch.fx.GraphModule, bwd: torch.fx.GraphModule, n_out: int,
                seeds: Sequence[bool]) -> torch.fx.GraphModule:
    """The forward graph, then the backward graph on the forward's saved values and, for
    its gradient inputs, ones (``seeds``) or zeros; outputs: the forward's ``n_out``
    outputs, then the backward's."""
    g, root = torch.fx.Graph(), torch.nn.Module()

    def copy(n: torch.fx.Node, env: dict, gm: torch.fx.GraphModule, prefix: str) -> torch.fx.Node:
        if n.op != "get_attr":
            return g.node_copy(n, lambda x: env[x])
        name = f"{prefix}_{n.target.replace('.', '_')}"
        setattr(root, name, functools.reduce(getattr, n.target.split("."), gm))
        new = g.get_attr(name)
        new.meta = dict(n.meta)
        return new

    env: dict = {}
    for n in fwd.graph.nodes:
        if n.op != "output":
            env[n] = copy(n, env, fwd, "fwd")
    outs = list(fwd.graph.output_node().args[0])
    placeholders = list(bwd.graph.find_nodes(op="placeholder"))
    n_grads = len(seeds)
    benv: dict = {}
    for p, v in zip(placeholders[:len(placeholders) - n_grads], outs[n_out:]):
        benv[p] = env[v] if isinstance(v, torch.fx.Node) else v
    for p, seed in zip(placeholders[len(placeholders) - n_grads:], seeds):
        benv[p] = _constant(g, p.meta["val"], 1.0 if seed else 0.0)
    for n in bwd.graph.nodes:
        if n.op not in ("placeholder", "output"):
            benv[n] = copy(n, benv, bwd, "bwd")
    grads = bwd.graph.output_node().args[0]
    g.output(tuple([*(env[o] if isinstance(o, torch.fx.Node) else o for o in outs[:n_out]),
                    *(benv[o] if isinstance(o, torch.fx.Node) else o for o in grads)]))
    return torch.fx.GraphModule(root, g)


def _constant(g: torch.fx.Graph, val: torch.Tensor, fill: float) -> torch.fx.Node:
    """A node of ``fill`` laid out as ``val`` (the program gives a new result the strides
    its node recorded)."""
    n = g.call_function(torch.ops.aten.full.default, (list(val.shape), fill),
                        {"dtype": val.dtype, "layout": torch.strided, "device": val.device,
                         "pin_memory": False})
    n.meta["val"] = val
    return n


def zeros(val: torch.Tensor) -> torch.Tensor:
    """A zero gradient laid out as ``val`` (the one traced)."""
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device).zero_()


def rerun(forward: GraphProgram, args: Sequence[Any], versions: Sequence[int], key: Any) -> list[Any]:
    """The forward program's outputs again, for a backward the joint program did not
    compute: its inputs must be as they were, and its random ops take the joint program's
    ``key`` (the forward's nodes come first there, so each op draws what it drew)."""
    now = [a._version for a in args if isinstance(a, torch.Tensor)]
    if now != list(versions):
        raise RuntimeError(
            "an input of a compiled training graph was modified by an inplace operation between "
            "its forward and a backward that needs the forward's values again (the forward ran "
            "with its backward at once, for a loss.backward() that did not come). Run the "
            "in-place change after the backward, or set TPU_KERNELS_COMPILE_JOINT=0.")
    forward.replay_key = key
    try:
        return forward(*args)
    finally:
        forward.replay_key = None
