"""Timing helpers shared by the benchmarks: warm-up, then median/min/max of synced calls."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from tpu_kernels.tensor import TpuTensor, value


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
            min_time: float = 0.0) -> dict[str, float]:
    """Seconds per call: first call (compile included), median, min, max after warm-up."""
    t0 = time.perf_counter()
    sync(fn())
    first = time.perf_counter() - t0
    for _ in range(warmup):
        sync(fn())
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < iters or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        sync(fn())
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"first": first, "median": med, "min": min(times), "max": max(times),
            "compile": max(first - med, 0.0), "n": len(times)}


@torch.no_grad()
def no_grad_call(fn: Callable[[], Any]) -> Any:
    return fn()
