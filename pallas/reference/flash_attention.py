"""Plain jax.numpy reference for ``pallas/flash_attention.py`` (torch SDPA semantics)."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None = None,
              *, causal: bool = False, scale: float | None = None,
              q_segment_ids: jax.Array | None = None, kv_segment_ids: jax.Array | None = None,
              window: int | None = None) -> jax.Array:
    """softmax(q k^T * scale + mask) v; q [b,hq,sq,d], k/v [b,hkv,skv,d], hq % hkv == 0.

    Boolean mask: True = keep. Causal is top-left aligned (``tril(ones(sq, skv))``);
    ``window``: also row - col < window. Segment ids [b, sq], [b, skv]: keep equal ids.
    Rows with every key masked give 0 (torch's safe softmax).
    """
    b, hq, sq, d = q.shape
    rep = hq // k.shape[1]
    k = jnp.repeat(k, rep, axis=1).astype(jnp.float32)
    v = jnp.repeat(v, rep, axis=1).astype(jnp.float32)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), k, precision=_HI) * scale
    keep = jnp.ones(s.shape, bool)
    if causal:
        keep = keep & jnp.tril(jnp.ones((sq, k.shape[2]), bool))
    if window is not None:
        keep = keep & ~jnp.tril(jnp.ones((sq, k.shape[2]), bool), -window)
    if q_segment_ids is not None:
        keep = keep & (q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :])
    if mask is not None:
        if mask.dtype == jnp.bool_:
            keep = keep & mask
        else:
            s = s + mask.astype(jnp.float32)
    s = jnp.where(keep, s, -jnp.inf)
    mx = jnp.max(s, axis=-1, keepdims=True)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    p = jnp.where(keep, jnp.exp(s - mx), 0.0)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    p = p / jnp.where(denom == 0, 1.0, denom)
    out = jnp.einsum("bhqk,bhkd->bhqd", p, v, precision=_HI)
    return out.astype(q.dtype)
