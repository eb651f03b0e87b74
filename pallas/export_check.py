"""Prove a Pallas kernel lowers for TPU on a machine without one.

``jax.export`` with ``platforms=["tpu"]`` runs the Pallas -> Mosaic lowering, which
rejects illegal block shapes; interpret mode does not.
"""
from __future__ import annotations

from typing import Any, Callable

import jax


def lower_for_tpu(fn: Callable[..., Any], *args: Any) -> jax.export.Exported:
    """Export ``fn`` (called with ``interpret=False`` already bound) for TPU.

    ``args`` are arrays or ``jax.ShapeDtypeStruct``s. Raises the lowering error when
    the kernel would not compile for TPU.
    """
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    return jax.export.export(jax.jit(fn), platforms=["tpu"])(*specs)
