"""Helpers of the reduction lowerings: the reduced axes of a ``dim`` argument, the
accumulation dtype, element counts, keepdim."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels.registry.xla._util import float_compute


def reduced_axes(dim: Any, ndim: int) -> tuple[int, ...]:
    """Reduced axes for an ``int``/``int[]?`` dim argument; None or [] mean all axes.

    A 0-d tensor accepts dim 0/-1 and reduces nothing."""
    if ndim == 0:
        return ()
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(sorted({d % ndim for d in dim}))


def one_axis(dim: int, ndim: int) -> int | None:
    """One axis (None for a 0-d tensor, whose only valid dims are 0 and -1)."""
    return None if ndim == 0 else dim % ndim


def acc_dtype(dtype) -> np.dtype:
    """The dtype a reduction accumulates in: float32 for half types, else ``dtype``."""
    return float_compute(dtype)


def count_of(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    return int(np.prod([shape[a] for a in axes], dtype=np.int64))


def is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def keep_dims(x: jax.Array, axes: tuple[int, ...], keepdim: bool) -> jax.Array:
    """Re-insert reduced axes as size 1 (for results computed without keepdims)."""
    return jnp.expand_dims(x, axes) if keepdim and axes else x
