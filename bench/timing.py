"""Timing helpers shared by the benchmarks: warm-up, then median/min/max of synced calls."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

from tpu_kernels.tensor import TpuTensor
from tpu_kernels.tensor_values import value
def sync(x: Any) -> None:
    """Block until every tpu tensor (or jax array) in ``x`` is computed."""
    if isinstance(x, (list, tuple)):
        for y in x:
            sync(y)
        return
    if isinstance(x, TpuTensor):
        value(x).block_until_ready()
    elif hasattr(x, "block_until_ready"):
        x.block_until_ready()


def measure(fn: Callable[[], Any], *, warmup: int = 3, iters: int = 20,
            min_time: float = 0.0, clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds per call: first call (compile included), median, min, max after warm-up.
    ``clock``: wall time, or e.g. ``time.process_time`` (the CPU time of all the process's
    threads, XLA's included: steadier than wall time on a loaded machine)."""
    t0 = clock()
    sync(fn())
    first = clock() - t0
    for _ in range(warmup):
        sync(fn())
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < iters or time.perf_counter() - start < min_time:
        t0 = clock()
        sync(fn())
        times.append(clock() - t0)
    med = statistics.median(times)
    return {"first": first, "median": med, "min": min(times), "max": max(times),
            "compile": max(first - med, 0.0), "n": len(times)}


def sync_all(out: Any) -> None:
    """``sync`` every tensor in a (nested) result."""
    for t in tree_flatten(out)[0]:
        sync(t)


def outputs(result: Any, args: Any) -> list[torch.Tensor]:
    """The tensors an op produced: its results, or (in-place ops returning nothing) its args."""
    ts = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
    return ts or [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]


def measure_call(call: Callable[[], Any], sync_of: Callable[[Any], list], *, warmup: int, iters: int,
            budget_s: float) -> tuple[dict[str, float], Any]:
    """Time ``call``: the first call (compile included), then ``warmup`` calls, then up to
    ``iters`` timed calls (at least 3, fewer than ``iters`` once ``budget_s`` is spent).
    Returns the stats and the first call's result."""
    t0 = time.perf_counter()
    first_out = call()
    sync_all(sync_of(first_out))
    first = time.perf_counter() - t0
    for _ in range(warmup):
        sync_all(sync_of(call()))
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < iters:
        t0 = time.perf_counter()
        sync_all(sync_of(call()))
        times.append(time.perf_counter() - t0)
        if len(times) >= 3 and time.perf_counter() - start > budget_s:
            break
    med = statistics.median(times)
    return ({"first_s": first, "median_s": med, "min_s": min(times), "max_s": max(times),
             "compile_s": max(first - med, 0.0), "n": len(times)}, first_out)


@torch.no_grad()
def no_grad_call(fn: Callable[[], Any]) -> Any:
    return fn()
