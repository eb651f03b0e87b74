"""Helpers of the indexing lowerings: the out-of-range policy.

Out-of-range indices: XLA would clamp them silently. Until device-side error flags
exist, every read here uses ``mode="fill"`` (out-of-range reads give 0) and every
write ``mode="drop"`` (out-of-range writes are skipped), consistently. Negative indices
wrap as in torch where torch allows them (advanced indexing, take, put).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_kernels.registry.context import check


def add_at(ref, values):
    """``x.at[idx].add(values)``; torch adds bools as logical or (XLA has no bool add)."""
    if ref.array.dtype == jnp.bool_:
        return ref.max(values.astype(jnp.bool_), mode="drop")
    return ref.add(values, mode="drop")


def in_range(index: jax.Array, size: int, what: str, *, negative: bool = False,
             exc: type = IndexError) -> None:
    """XLA fills or drops out-of-range indices silently; torch raises: check (deferred)."""
    lo = -size if negative else 0
    check((index >= lo) & (index < size), f"{what} (an index is outside [{lo}, {size}))", exc)


def check_masks(shape: tuple[int, ...], indices) -> None:
    """torch's ``expandTensors``: a bool/uint8 mask must match the dims it indexes, else
    XLA would read or write the wrong rows. Shapes are static: raise now, in CPU's words."""
    if len(indices) > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)} (got {len(indices)})")
    d = 0   # the dim of ``shape`` the next index starts at
    for ix in indices:
        if ix is None or ix.dtype not in (jnp.bool_, jnp.uint8):
            d += 1
            continue
        for j, n in enumerate(ix.shape):
            if d + j >= len(shape):   # CPU's self.size(d + j) fails first
                raise IndexError(f"Dimension out of range (expected to be in range of "
                                 f"[{-len(shape)}, {len(shape) - 1}], but got {d + j})")
            if n != shape[d + j]:
                raise IndexError(f"The shape of the mask {list(ix.shape)} at index {j} does not "
                                 f"match the shape of the indexed tensor {list(shape)} at index {d + j}")
        d += ix.ndim


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """``a`` and ``b`` broadcast, or torch's ``infer_size`` error where jax's would be a
    ValueError ("The size of tensor a (3) must match the size of tensor b (5) ...")."""
    return tuple(torch._C._infer_size(torch.Size(a), torch.Size(b)))


def read(x: jax.Array, idx) -> jax.Array:
    return x.at[idx].get(mode="fill", fill_value=0)
