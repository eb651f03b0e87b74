"""Plain jax.numpy references for ``pallas/grouped_matmul.py`` (per-row group ids)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def _row_groups(group_sizes: jax.Array, m: int) -> jax.Array:
    """Group id of each of the ``m`` rows; rows past ``sum(group_sizes)`` get ``g``."""
    ends = jnp.cumsum(group_sizes)
    return jnp.searchsorted(ends, jnp.arange(m), side="right")


def gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """out[r] = lhs[r] @ rhs[group(r)]; rows outside every group are zero."""
    g = rhs.shape[0]
    gid = _row_groups(group_sizes, lhs.shape[0])
    w = rhs.astype(jnp.float32)[jnp.minimum(gid, g - 1)]            # [m, k, n]
    out = jnp.einsum("mk,mkn->mn", lhs.astype(jnp.float32), w, precision=_HI)
    return jnp.where((gid < g)[:, None], out, 0).astype(lhs.dtype)


def tgmm(lhs: jax.Array, grad: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """out[i] = lhs[rows of i]^T @ grad[rows of i] -> [g, k, n]."""
    g = group_sizes.shape[0]
    gid = _row_groups(group_sizes, lhs.shape[0])
    onehot = (gid[:, None] == jnp.arange(g)[None, :]).astype(jnp.float32)  # [m, g]
    out = jnp.einsum("mg,mk,mn->gkn", onehot, lhs.astype(jnp.float32),
                     grad.astype(jnp.float32), precision=_HI)
    return out.astype(lhs.dtype)


def ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """Differentiable reference: same math as ``gmm`` through autodiff."""
    return gmm(lhs, rhs, group_sizes)
