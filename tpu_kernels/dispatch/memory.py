"""Refusing, before compiling, a result that cannot fit: torch's OutOfMemoryError naming
the op and the size, instead of XLA trying (and the host swapping or being killed)."""
from __future__ import annotations

import math

import jax
import psutil
import torch

GUARD_MIN_BYTES = 1 << 26   # results smaller than this are never checked against free memory


def available_bytes() -> int | None:
    """Free memory where results live: host RAM for JAX's CPU backend, else the device's."""
    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return psutil.virtual_memory().available
    stats = dev.memory_stats() or {}
    if "bytes_limit" in stats:
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    return None


def guard_memory(op, outs) -> None:
    """Raise ``torch.OutOfMemoryError`` when the results ``outs`` (OutMeta) cannot fit."""
    sizes = [(m, math.prod(m.shape) * m.dtype.itemsize) for m in outs if m is not None]
    need = sum(n for _, n in sizes)
    if need < GUARD_MIN_BYTES:
        return
    free = available_bytes()
    if free is not None and need > free:
        shapes = ", ".join(f"{list(m.shape)} {m.dtype}" for m, _ in sizes)
        raise torch.OutOfMemoryError(
            f"{op}: tpu out of memory: tried to allocate {_gib(need)} ({shapes}) with "
            f"{_gib(free)} free")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
