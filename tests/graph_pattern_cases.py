"""Running a function compiled for tpu with the graph pattern pass on and off, and on CPU:
the rewrites it made, the ops its programs ran, and outputs and gradients compared."""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from tpu_kernels import compile_backend, graph_patterns
from tpu_kernels.testing import tol


def _copies(args: list, device: str, grads: int | None) -> list:
    out = []
    for i, a in enumerate(args):
        t = a.detach().clone().to(device) if isinstance(a, torch.Tensor) else a
        if isinstance(t, torch.Tensor) and t.is_floating_point() and (grads is None or i < grads):
            t.requires_grad_()
        out.append(t)
    return out


def _run(fn: Callable, args: list, device: str, compiled: bool, grads: int | None) -> tuple[Any, list]:
    ins = _copies(args, device, grads)
    if compiled:
        torch._dynamo.reset()     # a cached compile from the other setting must not answer
        fn = torch.compile(fn, backend="tpu")
    out = fn(*ins)
    out.float().square().sum().backward()
    return out, [t.grad for t in ins if isinstance(t, torch.Tensor) and t.requires_grad]


def check(fn: Callable, args: list, grads: int | None = None, kernel: bool = True, off: bool = True) -> tuple[dict[str, int], set[str]]:
    """Compare ``fn(*args)`` compiled for tpu with the pass on, off (unless not ``off``)
    and on CPU: the output, and the gradients of ``out.square().sum()`` for the first
    ``grads`` arguments (or every floating one). Returns the rewrites made with the pass
    on and the ops of the programs compiled then."""
    saved = os.environ.pop("TPU_KERNELS_GRAPH_PATTERNS", None)
    try:
        ref, ref_grads = _run(fn, args, "cpu", compiled=False, grads=grads)
        before, n = dict(graph_patterns.REWRITES), len(compile_backend.PROGRAMS)
        results = [_run(fn, args, "tpu", compiled=True, grads=grads)]
        done = {k: v - before.get(k, 0) for k, v in graph_patterns.REWRITES.items() if v != before.get(k, 0)}
        ops = {str(node.target) for p in compile_backend.PROGRAMS[n:] for node in p.gm.graph.nodes}
        os.environ["TPU_KERNELS_GRAPH_PATTERNS"] = "0"
        if off:
            results.append(_run(fn, args, "tpu", compiled=True, grads=grads))
    finally:
        os.environ.pop("TPU_KERNELS_GRAPH_PATTERNS", None)
        if saved is not None:
            os.environ["TPU_KERNELS_GRAPH_PATTERNS"] = saved
    t = tol(ref.dtype, kernel=kernel)
    for out, got in results:
        torch.testing.assert_close(out.cpu(), ref.detach(), **t)
        for g, r in zip(got, ref_grads):
            if r is None:         # an argument the function does not use
                assert g is None
            else:
                torch.testing.assert_close(g.cpu(), r, **t)
    return done, ops
