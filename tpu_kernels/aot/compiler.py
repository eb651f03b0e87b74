"""``compile(fn, *specs, chip=...)``: XLA:TPU and Mosaic, for a named chip, on any machine.

The function is traced under ``tpu_info.compile_for(chip)``, so every Pallas and Helion
kernel inside it lowers to Mosaic with blocks sized for that chip, and the program is
compiled by libtpu for the chip's compile-only topology. Nothing runs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import time
from typing import Any, Callable, Iterator

import jax

from tpu_kernels.aot import topology
from tpu_kernels.aot.summary import Summary, summarize
from tpu_kernels.pallas import tpu_info


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A program compiled for one chip: the executable JAX made and the compiler's figures."""
    executable: jax.stages.Compiled
    summary: Summary

    def as_text(self) -> str:
        return self.executable.as_text()


def compile(fn: Callable[..., Any], *specs: Any, chip: str = "v6e",
            static_argnums: tuple[int, ...] = (), donate_argnums: tuple[int, ...] = (),
            **kwargs: Any) -> Compiled:
    """Compile ``fn(*specs, **kwargs)`` for ``chip`` ("v5e", "v6e", "v7x", "v5p", "v4").

    ``specs`` are arrays, ``jax.ShapeDtypeStruct``s or pytrees of them (their placement
    is replaced by the chip's device); ``static_argnums`` and ``kwargs`` are passed as
    static values, ``donate_argnums`` as to ``jax.jit`` (updated in place: aliased HBM).
    Raises what the compiler raises; ``explain(exc)`` shortens it.
    """
    row = tpu_info.chip(chip)
    placed = topology.on_chip(specs, row)

    def program(*args):       # a fresh function: no trace cached for another chip
        return fn(*args, **kwargs)

    jitted = jax.jit(program, static_argnums=static_argnums, donate_argnums=donate_argnums)
    return compile_lowered(lambda: jitted.lower(*placed), row.name)


def compile_lowered(lower: Callable[[], jax.stages.Lowered], chip: str,
                    compiler_options: dict[str, str] | None = None) -> Compiled:
    """Run ``lower()`` (a function that traces and lowers a program) and compile the result
    for ``chip``, with kernels lowering to Mosaic for that chip; ``compiler_options`` are
    XLA/libtpu options for this compile (e.g. ``overlap.ASYNC_COLLECTIVES``)."""
    row = tpu_info.chip(chip)
    start = time.perf_counter()
    with tpu_info.compile_for(row), _no_persistent_cache():
        executable = lower().compile(compiler_options=compiler_options or None)
    return Compiled(executable, summarize(executable, row.name, time.perf_counter() - start))


@contextlib.contextmanager
def _no_persistent_cache() -> Iterator[None]:
    """Compile-only executables cannot be read back from JAX's persistent cache (there is
    no TPU client to load them into): keep them out of it."""
    old = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", old)


# What the compiler's errors mean, most specific first: (pattern, explanation).
_REASONS: tuple[tuple[str, str], ...] = (
    (r"func\.return.*i64|index_map.*int64|\(i32, i32, i32, i64\)",
     "an index map returns int64 (jax_enable_x64 leaked into the kernel: trace it in 32-bit)"),
    (r"truncf.*f64|f64.*truncf|extf.*f64",
     "a 64-bit float in the kernel body (a Python float traced under jax_enable_x64)"),
    (r"failed to legalize operation '([\w.]+)'",
     "Mosaic cannot lower operation {0} (unsupported op, dtype or layout in the body)"),
    (r"(?:Slice sizes|Offsets) along tiled dimensions must be aligned",
     "a DMA or slice is not tile-aligned (packed rows, e.g. bf16, move in whole tiles)"),
    (r"Scoped allocation with size ([\d.]+\w) and limit ([\d.]+\w)",
     "VMEM: the kernel needs {0} of scoped VMEM, the limit is {1} (raise vmem_limit_bytes "
     "or shrink the blocks)"),
    (r"would exceed memory \(size=(\d+)\)",
     "VMEM: the kernel needs more than the chip's {0} bytes of VMEM (shrink the blocks)"),
    (r"memory required for HLO temporaries \((\S+)\) exceeds available HBM \((\S+)\)",
     "HBM: the program's temporaries need {0}, the chip has {1}"),
    (r"Ran out of memory (?:in memory space hbm|on HBM)",
     "HBM: the program does not fit the chip's HBM"),
    (r"Unsupported TPU device kind: (\w+)",
     "the Pallas lowering was not told the target chip (device kind {0})"),
    (r"last two dimensions of your block shape are divisible by 8 and 128",
     "a block's last two dims are not multiples of (8, 128) nor the full array dims"),
)


def explain(exc: BaseException) -> str:
    """A one-line reason for a compile failure: what it means and what to do."""
    text = f"{type(exc).__name__}: {exc}"
    for pattern, meaning in _REASONS:
        m = re.search(pattern, text, re.S)
        if m:
            return meaning.format(*m.groups())
    first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return f"{type(exc).__name__}: {first[:240]}"


@functools.cache
def _warm(chip: str) -> None:
    """Load libtpu and the topology once per process (a few seconds, before any timing)."""
    topology.device(chip)


def warm(*chips: str) -> None:
    for c in chips:
        _warm(tpu_info.chip(c).name)
