"""Peak FLOP/s and bytes/s that benchmark results are put against (the roofline).

TPU and GPU peaks come from the one table in ``tpu_kernels.pallas.tpu_info`` (vendor
figures, bf16 dense). The CPU has no table: its peak is measured once per process with a
large float32 matmul and a large copy (``torch`` on all threads, about a second or two).
"""
from __future__ import annotations

import dataclasses
import functools
import time

import jax
import torch

from tpu_kernels.pallas.tpu_info import CHIPS, GPUS, device_chip


@dataclasses.dataclass(frozen=True)
class Peak:
    name: str                 # "v5e", "H100", "cpu (2 threads)"
    flops: float              # FLOP/s
    bytes_per_s: float        # memory bandwidth, B/s
    source: str               # "table" (vendor figure) or "measured"
    note: str = ""

    def attainable(self, intensity: float) -> float:
        """Roofline FLOP/s at ``intensity`` FLOP/byte."""
        return min(self.flops, intensity * self.bytes_per_s)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _best(fn, reps: int, budget_s: float) -> float:
    """Fastest of ``reps`` calls (stops early once ``budget_s`` is spent)."""
    fn()  # warm-up (allocations, thread pool)
    best, start = float("inf"), time.perf_counter()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return best


@functools.cache
def cpu_peak(n: int = 1024, copy_mib: int = 64, budget_s: float = 1.0) -> Peak:
    """Measured CPU peak: best of a few ``n x n`` float32 matmuls and ``copy_mib`` MiB copies."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    t_mm = _best(lambda: torch.mm(a, b, out=out), 20, budget_s)
    src = torch.empty(copy_mib * 1024 * 1024 // 4)
    src.fill_(1.0)
    dst = torch.empty_like(src)
    t_cp = _best(lambda: dst.copy_(src), 20, budget_s)
    return Peak(f"cpu ({torch.get_num_threads()} threads)", 2 * n ** 3 / t_mm,
                2 * src.numel() * 4 / t_cp, "measured",
                f"float32 {n}x{n} matmul; {copy_mib} MiB copy (read + write)")


def table_peak(name: str) -> Peak:
    """A TPU generation (``v5e``...) or GPU (``H100``...) from the tpu_info tables."""
    row = CHIPS.get(name) or GPUS.get(name)
    if row is None:
        raise KeyError(f"no peak row {name!r}; known: {sorted(CHIPS) + sorted(GPUS)}")
    return Peak(row.name, row.bf16_flops, row.hbm_bytes_per_s, "table", "bf16 dense, HBM")


def device_peak() -> Peak:
    """The peak of the device tpu tensors run on: JAX's default device."""
    backend = jax.default_backend()
    if backend == "tpu":
        return table_peak(device_chip().name)
    if backend in ("gpu", "cuda", "rocm"):
        kind = jax.devices()[0].device_kind
        for name in GPUS:
            if name.lower() in kind.lower():
                return table_peak(name)
        return dataclasses.replace(cpu_peak(), name=f"{kind} (no table row: CPU peak shown)")
    return cpu_peak()


def device_description() -> str:
    d = jax.devices()[0]
    return f"{jax.default_backend()}: {getattr(d, 'device_kind', d.platform)}"
