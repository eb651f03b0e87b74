"""Per-generation TPU facts that kernels and benchmarks size themselves by.

One table, used by block-size heuristics (VMEM, MXU width) and by the benchmark's
roofline (peak bf16 FLOP/s, HBM bandwidth). Figures are public vendor numbers per chip.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Iterator

import jax

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    vmem_bytes: int          # physical VMEM per TensorCore
    scoped_vmem_bytes: int   # Mosaic's default scoped VMEM limit
    mxu: int                 # MXU width: block sizes should be multiples of it
    bf16_flops: float        # peak dense bf16 FLOP/s per chip
    hbm_bytes_per_s: float   # peak HBM bandwidth per chip
    hbm_bytes: int           # HBM capacity per chip


CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 16 * MiB, 16 * MiB, 128, 275e12, 1.2e12, 32 * 1024 * MiB),
    "v5e": Chip("v5e", 128 * MiB, 16 * MiB, 128, 197e12, 0.819e12, 16 * 1024 * MiB),
    "v5p": Chip("v5p", 64 * MiB, 16 * MiB, 128, 459e12, 2.765e12, 95 * 1024 * MiB),
    "v6e": Chip("v6e", 128 * MiB, 32 * MiB, 256, 918e12, 1.64e12, 32 * 1024 * MiB),
    "v7": Chip("v7", 64 * MiB, 32 * MiB, 256, 2307e12, 7.37e12, 192 * 1024 * MiB),
}


@dataclasses.dataclass(frozen=True)
class GPU:
    """A GPU row for the benchmark's roofline (same units as ``Chip``)."""
    name: str
    smem_bytes: int          # shared memory per SM
    bf16_flops: float        # peak dense bf16 FLOP/s (tensor cores, no sparsity)
    hbm_bytes_per_s: float   # peak HBM bandwidth
    hbm_bytes: int           # HBM capacity


# SXM parts, vendor datasheet figures (dense, i.e. without 2:4 sparsity).
GPUS: dict[str, GPU] = {
    "H100": GPU("H100", 228 * 1024, 989e12, 3.35e12, 80 * 1024 * MiB),
    "H200": GPU("H200", 228 * 1024, 989e12, 4.8e12, 141 * 1024 * MiB),
}

# Generations whose scoped VMEM every kernel's block choice is checked against.
CHECKED_GENERATIONS = ("v5e", "v6e", "v7")
# Blocks x buffers + scratch must stay under this share of the scoped limit.
VMEM_BUDGET_FRACTION = 0.75


def on_tpu() -> bool:
    """True when JAX's default backend is a TPU."""
    return jax.default_backend() == "tpu"


_TARGETING_TPU: contextvars.ContextVar[bool] = contextvars.ContextVar("tpu_kernels_targeting_tpu", default=False)


@contextlib.contextmanager
def targeting_tpu() -> Iterator[None]:
    """Within the block, kernels called with ``interpret=None`` take their TPU (Mosaic)
    path even off TPU: for lowering them for TPU on a machine without one."""
    token = _TARGETING_TPU.set(True)
    try:
        yield
    finally:
        _TARGETING_TPU.reset(token)


def resolve_interpret(interpret: bool | None) -> bool:
    """``None`` means: interpret off TPU, compile on TPU (or inside ``targeting_tpu()``)."""
    if interpret is not None:
        return interpret
    return not (on_tpu() or _TARGETING_TPU.get())


@functools.cache
def current_chip() -> Chip:
    """The chip JAX runs on; off TPU the v5e row stands in (kernels still size blocks)."""
    if not on_tpu():
        return CHIPS["v5e"]
    kind = jax.devices()[0].device_kind.lower()
    for key, names in (("v7", ("v7", "tpu7")), ("v6e", ("v6",)), ("v5p", ("v5p",)),
                       ("v5e", ("v5 lite", "v5e", "v5litepod")), ("v4", ("v4",))):
        if any(n in kind for n in names):
            return CHIPS[key]
    return CHIPS["v5e"]


def block_bytes(shape: tuple[int, ...], dtype) -> int:
    """Bytes one VMEM block of ``shape`` and ``dtype`` occupies."""
    n = 1
    for d in shape:
        n *= d
    return n * jax.numpy.dtype(dtype).itemsize


def vmem_budget(chip: Chip) -> int:
    """Bytes a kernel's blocks x buffers + scratch may use on ``chip``."""
    return int(chip.scoped_vmem_bytes * VMEM_BUDGET_FRACTION)


def sublane(dtype) -> int:
    """Rows in one (sublane, 128) tile for ``dtype``: 8 for 32-bit, 16 for bf16, 32 for 8-bit."""
    return 8 * (4 // jax.numpy.dtype(dtype).itemsize)
