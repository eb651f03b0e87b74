"""Per-generation TPU facts, and the one place that decides where a kernel runs.

One table, used by block-size heuristics (VMEM, MXU width), by the benchmark's roofline
(peak bf16 FLOP/s, HBM bandwidth) and by the ahead-of-time compiler (``tpu_kernels.aot``:
the libtpu compile-only topology of each chip). Figures are public vendor numbers per
JAX device: one chip, except v7x where each chip is two devices (one per TensorCore).

``target(interpret)`` answers, for every Pallas and Helion kernel, the two questions a
kernel wrapper has: run in interpret mode or lower to Mosaic, and which chip to size the
blocks for. On a TPU: Mosaic, the attached chip. Inside ``compile_for(chip)``: Mosaic,
that chip, whatever machine this is. Elsewhere: interpret mode, with blocks sized as for
``INTERPRET_CHIP`` (the results do not depend on it).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Iterator

import jax

MiB = 1024 * 1024
GiB = 1024 * MiB


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    vmem_bytes: int          # physical VMEM per TensorCore
    scoped_vmem_bytes: int   # Mosaic's default scoped VMEM limit (checked by compiling)
    mxu: int                 # MXU width: block sizes should be multiples of it
    bf16_flops: float        # peak dense bf16 FLOP/s per device
    hbm_bytes_per_s: float   # peak HBM bandwidth per device
    hbm_bytes: int           # HBM capacity per device
    device_kind: str = ""    # jax's Device.device_kind
    topology: str = ""       # libtpu compile-only topology (``aot``)


CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 16 * MiB, 16 * MiB, 128, 275e12, 1.2e12, 32 * GiB,
               "TPU v4", "v4:2x2x1"),
    "v5e": Chip("v5e", 128 * MiB, 16 * MiB, 128, 197e12, 0.819e12, 16 * GiB,
                "TPU v5 lite", "v5e:2x2"),
    "v5p": Chip("v5p", 64 * MiB, 16 * MiB, 128, 459e12, 2.765e12, 95 * GiB,
                "TPU v5", "v5p:2x2x1"),
    "v6e": Chip("v6e", 128 * MiB, 32 * MiB, 256, 918e12, 1.64e12, 32 * GiB,
                "TPU v6 lite", "v6e:2x2"),
    # TPU7x (Ironwood): 2307 TFLOP/s, 7.37 TB/s, 192 GB per chip of two devices.
    "v7x": Chip("v7x", 64 * MiB, 32 * MiB, 256, 1153.5e12, 3.685e12, 96 * GiB,
                "TPU7x", "tpu7x:2x2x1"),
}
_ALIASES = {"v7": "v7x", "tpu7x": "v7x", "v5litepod": "v5e", "v5 lite": "v5e", "v6": "v6e"}


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

# Generations every kernel is compiled for and whose VMEM its block choice is checked against.
CHECKED_GENERATIONS = ("v5e", "v6e", "v7x")
# Blocks x buffers + scratch should stay under this share of the default scoped limit.
VMEM_BUDGET_FRACTION = 0.75
# Interpret mode sizes blocks as for this chip (any row would do: results do not change).
INTERPRET_CHIP = "v5e"


def chip(name: str | Chip) -> Chip:
    """The table row for ``name`` (``"v6e"``, ``"v7"``, ``"TPU v6 lite"``, ...)."""
    if isinstance(name, Chip):
        return name
    key = name.lower().strip()
    key = _ALIASES.get(key, key)
    if key in CHIPS:
        return CHIPS[key]
    for row in CHIPS.values():
        if row.device_kind.lower() == key:
            return row
    raise ValueError(f"unknown TPU chip {name!r}; known: {sorted(CHIPS)}")


def on_tpu() -> bool:
    """True when JAX's default backend is a TPU."""
    return jax.default_backend() == "tpu"


@functools.cache
def device_chip() -> Chip:
    """The chip JAX runs on (only meaningful on a TPU)."""
    kind = jax.devices()[0].device_kind.lower()
    for key, names in (("v7x", ("v7", "tpu7")), ("v6e", ("v6",)), ("v5p", ("v5p",)),
                       ("v5e", ("v5 lite", "v5e", "v5litepod")), ("v5p", ("tpu v5",)),
                       ("v4", ("v4",))):
        if any(n in kind for n in names):
            return CHIPS[key]
    raise ValueError(f"device kind {kind!r} is not in the chip table ({sorted(CHIPS)})")


# -- where kernels run ---------------------------------------------------------------------

_COMPILE_FOR: contextvars.ContextVar[Chip | None] = contextvars.ContextVar(
    "tpu_kernels_compile_for", default=None)


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a kernel call lowers to: Mosaic for ``chip``, or interpret mode."""
    chip: Chip
    interpret: bool


def target(interpret: bool | None = None) -> Target:
    """The one decision every kernel wrapper asks for. ``interpret=None`` means: Mosaic on a
    TPU or inside ``compile_for``, interpret mode otherwise. Lowering to Mosaic off a TPU
    needs a chip to size the blocks for: only ``compile_for`` names one."""
    pinned = _COMPILE_FOR.get()
    if interpret is None:
        interpret = pinned is None and not on_tpu()
    if pinned is not None:
        return Target(pinned, bool(interpret))
    if on_tpu():
        return Target(device_chip(), bool(interpret))
    if interpret:
        return Target(CHIPS[INTERPRET_CHIP], True)
    raise ValueError(
        "a Pallas/Helion kernel was asked to lower for TPU (interpret=False) on a machine "
        "without one, and no chip was named: compile with tpu_kernels.aot.compile(fn, "
        "*specs, chip='v6e') or inside tpu_kernels.pallas.tpu_info.compile_for('v6e')")


def pinned() -> Chip | None:
    """The chip ``compile_for`` names, if any (cheap: dispatch keys its caches by it)."""
    return _COMPILE_FOR.get()


@contextlib.contextmanager
def compile_for(name: str | Chip) -> Iterator[Chip]:
    """Within the block, kernels lower to Mosaic and size their blocks for ``name``, and
    JAX's Pallas lowering reads that chip's facts (sublanes, generation) even on a
    machine whose devices are CPUs."""
    row = chip(name)
    token = _COMPILE_FOR.set(row)
    with _pallas_device_info(row):
        try:
            yield row
        finally:
            _COMPILE_FOR.reset(token)


@contextlib.contextmanager
def _pallas_device_info(row: Chip) -> Iterator[None]:
    """Pallas's Mosaic lowering asks ``get_tpu_info()`` about the default device; off a TPU
    that is a CPU, answered from jax's registry under the device kind ``"cpu"``. Name the
    target there for the duration (Helion's interpret runs register a TPU7x default)."""
    from jax._src.pallas.mosaic import tpu_info as jax_info

    version = jax_info.chip_version_from_device_kind(row.device_kind)
    if version is None:
        raise ValueError(f"jax does not know the device kind {row.device_kind!r}")
    cores = 2 if version in (jax_info.ChipVersion.TPU_V4, jax_info.ChipVersion.TPU_V5P) else 1
    info = jax_info.get_tpu_info_for_chip(version, cores)
    old = jax_info.registry.get("cpu")
    jax_info.registry["cpu"] = lambda: info
    try:
        yield
    finally:
        if old is None:
            jax_info.registry.pop("cpu", None)
        else:
            jax_info.registry["cpu"] = old


def mxu_precision(dtype) -> jax.lax.Precision:
    """The precision a kernel's dot names for operands of ``dtype``: float32 exact
    (HIGHEST: six bfloat16 passes), anything else one pass. Named, never left to JAX's
    default, which the lowering context sets to torch's matmul precision (Mosaic refuses
    HIGHEST on bfloat16 operands: 'Bad lhs type')."""
    return (jax.lax.Precision.HIGHEST if jax.numpy.dtype(dtype) == jax.numpy.float32
            else jax.lax.Precision.DEFAULT)


# -- VMEM arithmetic --------------------------------------------------------------------

def round_up(x: int, mult: int) -> int:
    """Smallest multiple of ``mult`` that is >= ``x``."""
    return -(-x // mult) * mult


def block_bytes(shape: tuple[int, ...], dtype) -> int:
    """Bytes one VMEM block of ``shape`` and ``dtype`` occupies."""
    n = 1
    for d in shape:
        n *= d
    return n * jax.numpy.dtype(dtype).itemsize


def tile_bytes(shape: tuple[int, ...], dtype) -> int:
    """Bytes a block really takes in VMEM: its last two dims padded to (sublane, 128) tiles."""
    *lead, r, c = (1,) * (2 - len(shape)) + tuple(shape)
    return block_bytes((*lead, round_up(r, sublane(dtype)), round_up(c, 128)), dtype)


def vmem_budget(chip: Chip) -> int:
    """Bytes a kernel's blocks x buffers + scratch may use on ``chip``: a share of the
    default scoped limit, so most kernels never need to raise it."""
    return int(chip.scoped_vmem_bytes * VMEM_BUDGET_FRACTION)


def sublane(dtype) -> int:
    """Rows in one (sublane, 128) tile for ``dtype``: 8 for 32-bit, 16 for bf16, 32 for 8-bit."""
    return 8 * (4 // jax.numpy.dtype(dtype).itemsize)
