"""Helpers of the indexing lowerings: the out-of-range policy.

Out-of-range indices: XLA would clamp them silently. Until device-side error flags
exist, every read here uses ``mode="fill"`` (out-of-range reads give 0) and every
write ``mode="drop"`` (out-of-range writes are skipped), consistently. Negative indices
wrap as in torch where torch allows them (advanced indexing, take, put).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

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


def read(x: jax.Array, idx) -> jax.Array:
    return x.at[idx].get(mode="fill", fill_value=0)
