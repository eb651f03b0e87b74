"""Where an eager op's time goes: the tpu path of ``x + y`` (64x64, every cache hit) timed
stage by stage, beside the floors it sits on (a bare cached ``jax.jit`` call, and torch's
``__torch_dispatch__`` on a wrapper subclass that does nothing).

Each stage is timed alone, calling the same functions the hot path calls
(``dispatch.run``: the op's state, ``fast_key`` and the FAST index, reading the inputs,
the settled executable ``CompiledCall.call``, ``tensor.wrap_fast``), with the same arguments, median over many calls; the
full signature path a call takes the first time it meets a shape is timed beside them.
"torch -> __torch_dispatch__" is measured, not derived: the same ``x + y`` with the hook
swapped for one that returns a ready tensor (torch's own work to reach the hook and take
its result back; the whole op minus the hook timed alone overstates it, since the hook
called alone runs warmer). ``thread_split`` gives the same split in this thread's CPU time,
results not waited for.
"""
from __future__ import annotations

import importlib
import statistics
import time
from typing import Any, Callable

import jax
import torch

from tpu_kernels import errors, tensor, tensor_values
from tpu_kernels.dispatch import cache

_run = importlib.import_module("tpu_kernels.dispatch.run")   # the module (the package exports the function)


def median_us(fn: Callable[[], Any], n: int = 2000) -> float:
    """Median microseconds of ``fn()`` (its result waited for) over ``n`` calls."""
    for _ in range(20):
        _wait(fn())
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        _wait(fn())
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def _wait(x: Any) -> None:
    if isinstance(x, tensor.TpuTensor):
        x = tensor_values.value(x)
    elif isinstance(x, tuple):      # lookup results hold no pending computation
        return
    jax.block_until_ready(x)


class _Nothing(torch.Tensor):
    """A wrapper subclass whose ``__torch_dispatch__`` only makes the result tensor."""

    @staticmethod
    def __new__(cls):
        return torch.Tensor._make_wrapper_subclass(cls, (64, 64), dtype=torch.float32, device="tpu")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _Nothing()


def _stages() -> dict[str, Callable[[], Any]]:
    """The stages of an eager ``add`` 64x64 and its floors, each a call that repeats it."""
    a, b = torch.randn(64, 64, device="tpu"), torch.randn(64, 64, device="tpu")
    op, args, kw = torch.ops.aten.add.Tensor, (a, b), {}
    _ = a + b                                   # compile: every later call hits every cache
    _ = a + b
    state = _run._state(op)
    compiled, pos, _, _, single, _ = cache.FAST[_run.fast_key(state, args)]
    dyn = [tensor_values.read(args[i]) for i in pos]
    out = _run.execute(op, compiled, dyn, args, kw)
    ja, jb = a.jax(), b.jax()
    bare = jax.jit(lambda x, y: x + y)
    n1, n2 = _Nothing(), _Nothing()
    return {
        "bare jax.jit call (floor)": lambda: bare(ja, jb),
        "torch dispatch to a do-nothing subclass (floor)": lambda: n1 + n2,
        "whole op (a + b)": lambda: a + b,
        "hook (dispatch entry, all stages)": lambda: tensor._dispatch(op, args, kw),
        "1 pending errors + op state (runtime handler)": lambda: (errors.pending(), _run._state(op).handler),
        "2 signature + cache lookup": lambda: cache.FAST.get(_run.fast_key(state, args)),
        "3 read inputs": lambda: _run._values(args, pos),
        # the executable, as the hot path calls it (``execute`` adds only attribute
        # checks); its results list, which ``_wait`` waits for (a tuple it would not)
        "4 executable call": lambda: compiled.call(*dyn)[0],
        "5 wrap results": lambda: tensor.wrap_fast(out[0], *single),
        "first call of a shape: full signature + CALLS lookup": lambda: _run.lookup(op, args, kw)[:2],
    }


def _torch_to_hook(measure: Callable[[Callable[[], Any]], float]) -> float:
    """``measure`` of ``x + y`` on tpu tensors whose hook returns a ready tensor at once."""
    a, b = torch.randn(64, 64, device="tpu"), torch.randn(64, 64, device="tpu")
    ready = a + b
    real = tensor._dispatch
    tensor._dispatch = lambda op, args, kwargs: ready
    try:
        return measure(lambda: a + b)
    finally:
        tensor._dispatch = real


def _with_entry(res: dict[str, float], measure: Callable[[Callable[[], Any]], float]) -> dict[str, float]:
    res["0 torch -> __torch_dispatch__ -> hook"] = _torch_to_hook(measure)
    return dict(sorted(res.items()))


def stage_split(n: int = 2000, rounds: int = 3) -> dict[str, float]:
    """Microseconds per stage of an eager ``add`` 64x64 (wall, result waited for; medians
    over ``rounds`` runs)."""
    stages = _stages()
    runs: dict[str, list[float]] = {k: [] for k in stages}
    for _ in range(rounds):
        for name, fn in stages.items():
            runs[name].append(median_us(fn, n))
    return _with_entry({k: statistics.median(v) for k, v in runs.items()}, lambda fn: median_us(fn, n))


def thread_us(fn: Callable[[], Any], n: int) -> float:
    """Microseconds of this thread's CPU time per call of ``fn`` over ``n`` calls, results
    not waited for: the Python and dispatch work alone, steady on a loaded machine (a
    preempted thread is not charged) where wall medians are not."""
    for _ in range(20):
        fn()
    t0 = time.thread_time_ns()
    for _ in range(n):
        fn()
    return (time.thread_time_ns() - t0) / n / 1e3


def thread_split(n: int = 2000, rounds: int = 7) -> dict[str, float]:
    """``stage_split`` by this thread's CPU time (``thread_us``; the median of ``rounds``
    blocks per stage, blocks of all stages interleaved)."""
    stages = _stages()
    runs: dict[str, list[float]] = {k: [] for k in stages}
    for _ in range(rounds):
        for name, fn in stages.items():
            runs[name].append(thread_us(fn, n))
    return _with_entry({k: statistics.median(v) for k, v in runs.items()},
                       lambda fn: statistics.median(thread_us(fn, n) for _ in range(rounds)))
