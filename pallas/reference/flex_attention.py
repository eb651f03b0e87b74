"""Dense jax.numpy FlexAttention: the reference for ``pallas/flex_attention.py`` and the
math of the XLA fallback (torch's CPU math path: scores in float32, mods applied per
entry, safe softmax, probabilities cast to the query dtype before the value matmul)."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def _per_entry(fn: Callable, *xs):
    for _ in range(4):
        fn = jax.vmap(fn)
    return fn(*xs)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, score_mod: Callable | None = None,
              mask_mod: Callable | None = None, score_args: Sequence[jax.Array] = (),
              mask_args: Sequence[jax.Array] = (), scale: float | None = None,
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(out, logsumexp, max score) of softmax(score_mod(q k^T * scale)) v over mask_mod.

    q [b, hq, sq, d], k [b, hkv, skv, d], v [b, hkv, skv, dv], hq % hkv == 0. The mods are
    per-entry functions ``score_mod(s, b, h, q_idx, kv_idx, *score_args)`` and
    ``mask_mod(b, h, q_idx, kv_idx, *mask_args)`` (indices int32, captured arrays whole).
    Rows with nothing kept: out 0, logsumexp and max -inf.
    """
    hq, d = q.shape[1], q.shape[3]
    rep = hq // k.shape[1]
    kr = jnp.repeat(k, rep, axis=1).astype(jnp.float32)
    vr = jnp.repeat(v, rep, axis=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), kr, precision=_HI) * scale
    shape = s.shape
    ids = [jax.lax.broadcasted_iota(jnp.int32, shape, a) for a in range(4)]
    if score_mod is not None:
        s = _per_entry(lambda x, *i: score_mod(x, *i, *score_args), s, *ids).astype(jnp.float32)
    keep = None
    if mask_mod is not None:
        keep = _per_entry(lambda *i: mask_mod(*i, *mask_args), *ids).astype(bool)
        s = jnp.where(keep, s, -jnp.inf)
    mx = jnp.max(s, axis=-1)
    safe = jnp.where(jnp.isfinite(mx), mx, 0.0)[..., None]
    p = jnp.exp(s - safe)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    lse = jnp.where(denom[..., 0] > 0, jnp.log(jnp.where(denom > 0, denom, 1.0))[..., 0]
                    + safe[..., 0], -jnp.inf)
    p = (p / jnp.where(denom == 0, 1.0, denom)).astype(q.dtype)
    out = jnp.einsum("bhqk,bhkd->bhqd", p, vr.astype(q.dtype), precision=_HI,
                     preferred_element_type=jnp.float32).astype(q.dtype)
    return out, lse, mx
