"""Serialise a Pallas kernel's Mosaic module for TPU (``jax.export``) on a machine without one.

This runs the Pallas -> Mosaic lowering only (illegal block shapes fail here), never
Mosaic's own legalisation, layouts or VMEM allocation: the real compile is
``tpu_kernels.aot.compile``. Kernels lower for ``chip`` (``tpu_info.compile_for``).
"""
from __future__ import annotations

from typing import Any, Callable

import jax

from tpu_kernels.pallas import tpu_info


def lower_for_tpu(fn: Callable[..., Any], *args: Any, chip: str = "v6e") -> jax.export.Exported:
    """Export ``fn`` for TPU with its kernels lowered to Mosaic for ``chip``.

    ``args`` are arrays or ``jax.ShapeDtypeStruct``s. Raises the lowering error when
    the kernel would not lower for TPU.
    """
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    with tpu_info.compile_for(chip):
        return jax.export.export(jax.jit(fn), platforms=["tpu"])(*specs)
