"""Flash attention (forward + backward) on TPU: torch SDPA semantics, GQA, and masks the
kernels build themselves. The op: what it supports, padding, block tables, custom_vjp.
The kernels (online softmax forward, dQ, dK/dV): ``flash_kernels.py``; blocks, block
tables and masks: ``flash_blocks.py``.

Kept entries: kv index < skv; causal (top-left, torch's ``is_causal``: col <= row);
sliding ``window`` (row - col < window); equal segment ids (packed sequences); a dense
mask (bool, carried as int8; or additive float where -inf masks). The structural ones are
computed from iota in the kernels and give the block tables that skip blocks they empty.
q, k, v keep their head dim; sequences pad to the blocks (the kv tail is masked) and the
results are sliced back. Rows with no kept key give 0 (logsumexp -inf).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from tpu_kernels.pallas import flash_blocks as fb
from tpu_kernels.pallas import flash_kernels as fk
from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.flash_blocks import Blocks, choose_blocks, vmem_bytes
from tpu_kernels.pallas.launch import pad_to

__all__ = ["flash_attention", "flash_attention_fwd", "flash_attention_bwd", "supports",
           "choose_blocks", "vmem_bytes", "Blocks"]

MAX_HEAD_DIM = 512
_SUPPORTED = ("float32", "bfloat16")


def supports(q_shape, q_dtype, k_shape, k_dtype, v_shape, v_dtype, mask_shape=None,
             mask_dtype=None, *, causal: bool = False, dropout_p: float = 0.0,
             scale: float | None = None, segment_ids_shapes=None,
             window: int | None = None) -> str | None:
    """None when the kernels handle these arguments, else the reason they do not.
    ``segment_ids_shapes``: (q ids shape, kv ids shape) or None."""
    if dropout_p:
        return "dropout_p > 0 runs on the XLA path"
    for dt in (q_dtype, k_dtype, v_dtype):
        if jnp.dtype(dt).name not in _SUPPORTED:
            return f"{jnp.dtype(dt).name} not supported (f32, bf16 only)"
    if not jnp.dtype(q_dtype) == jnp.dtype(k_dtype) == jnp.dtype(v_dtype):
        return "q, k, v dtypes differ"
    if not len(q_shape) == len(k_shape) == len(v_shape) == 4:
        return "q, k, v must be 4-D [batch, heads, seq, head_dim]"
    (b, hq, sq, d), (bk_, hkv, skv, dk), vs = q_shape, k_shape, tuple(v_shape)
    if bk_ != b or dk != d or vs != (b, hkv, skv, vs[3]):
        return "q, k, v shapes disagree"
    if vs[3] != d:
        return "value head_dim differs from query head_dim"
    if hkv == 0 or hq % hkv:
        return "query heads not a multiple of kv heads"
    if 0 in (b, hq, sq, skv, d):
        return "empty input"
    if d > MAX_HEAD_DIM:
        return f"head_dim > {MAX_HEAD_DIM}"
    if window is not None and (not causal or window < 1):
        return "a sliding window needs causal=True and window >= 1"
    if segment_ids_shapes is not None and tuple(map(tuple, segment_ids_shapes)) != ((b, sq), (b, skv)):
        return f"segment ids must be [batch, sq] and [batch, skv] = {(b, sq)}, {(b, skv)}"
    if mask_shape is not None:
        mdt = jnp.dtype(mask_dtype) if mask_dtype is not None else jnp.dtype(bool)
        if mdt != jnp.bool_ and mdt.name not in _SUPPORTED:
            return f"mask dtype {mdt.name} not supported (bool, f32, bf16)"
        try:
            ok = len(mask_shape) <= 4 and jnp.broadcast_shapes(
                tuple(mask_shape), (b, hq, sq, skv)) == (b, hq, sq, skv)
        except ValueError:
            ok = False
        if not ok:
            return "mask not broadcastable to [batch, heads, sq, skv]"
    return None


# --- wrapper: padding, tables, custom_vjp ---------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attention(q, k, v, mask, q_ids, kv_ids, cfg):
    qp, kp, vp, seg, mp, tables = fb.prepare(q, k, v, mask, q_ids, kv_ids, cfg.lay, cfg.causal, cfg.window)
    o, _ = fk.fwd(qp, kp, vp, _pair(seg, 0), mp, tables, cfg)
    return o[:, :, :q.shape[2]]


def _attention_fwd(q, k, v, mask, q_ids, kv_ids, cfg):
    qp, kp, vp, seg, mp, tables = fb.prepare(q, k, v, mask, q_ids, kv_ids, cfg.lay, cfg.causal, cfg.window)
    o, lse = fk.fwd(qp, kp, vp, _pair(seg, 0), mp, tables, cfg)
    # lse is kept as [b, hq, sqp], not lane-replicated: 1/128 of the residual memory
    return (o[:, :, :q.shape[2]],
            ((qp, kp, vp, seg, mp, tables), o, lse[:, :, 0], mask, q_ids, kv_ids))


def _pair(seg, which: int):
    """The segment ids of the forward and dQ (0) or of dK/dV (1)."""
    return None if seg is None else seg[2 * which:2 * which + 2]


def _backward(cfg: fk.Config, padded, o, lse, g):
    """(dq, dk, dv) at the true lengths from padded operands and the padded forward."""
    qp, kp, vp, seg, mp, tables = padded
    do = pad_to(g.astype(qp.dtype), qp.shape)
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    # dQ reads lse and delta as (bq, 128) columns, dK/dV as (8, bq) rows
    cols, rows = (fb.columns(lse), fb.columns(delta)), (fb.rows(lse), fb.rows(delta))
    dq = fk.dq(qp, kp, vp, do, *cols, _pair(seg, 0), mp, tables, cfg)
    dk, dv = fk.dkv(qp, kp, vp, do, *rows, _pair(seg, 1), mp, tables, cfg)
    return dq[:, :, :cfg.lay.sq], dk[:, :, :cfg.lay.skv], dv[:, :, :cfg.lay.skv]


def _attention_bwd(cfg, res, g):
    padded, o, lse, mask, q_ids, kv_ids = res
    # The mask and the segment ids get no gradient (zero cotangents).
    zero = [None if x is None else jnp.zeros(x.shape, jax.dtypes.float0)
            if not jnp.issubdtype(x.dtype, jnp.floating) else jnp.zeros_like(x)
            for x in (mask, q_ids, kv_ids)]
    return (*_backward(cfg, padded, o, lse, g), *zero)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _config(q, k, v, mask, causal, scale, dropout_p, block, interpret, q_ids, kv_ids,
            window) -> fk.Config:
    if (q_ids is None) != (kv_ids is None):
        raise ValueError("pallas flash_attention: pass both q_segment_ids and kv_segment_ids "
                         "or neither")
    reason = supports(q.shape, q.dtype, k.shape, k.dtype, v.shape, v.dtype,
                      None if mask is None else mask.shape,
                      None if mask is None else mask.dtype, causal=causal, dropout_p=dropout_p,
                      segment_ids_shapes=None if q_ids is None else (q_ids.shape, kv_ids.shape),
                      window=window)
    if reason:
        raise ValueError(f"pallas flash_attention: {reason}")
    d, sq, skv = q.shape[3], q.shape[2], k.shape[2]
    target = tpu_info.target(interpret)
    msz = 0 if mask is None else (1 if mask.dtype == jnp.bool_ else mask.dtype.itemsize)
    bq, bk = tuple(block) if block else choose_blocks(sq, skv, d, q.dtype, target.chip, msz,
                                                      q_ids is not None, bool(causal))
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return fk.Config(bool(causal), window, scale, fb.Layout(sq, skv, bq, bk), target)


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None = None,
                    *, causal: bool = False, scale: float | None = None,
                    dropout_p: float = 0.0, block: Blocks | None = None,
                    interpret: bool | None = None, q_segment_ids: jax.Array | None = None,
                    kv_segment_ids: jax.Array | None = None,
                    window: int | None = None) -> jax.Array:
    """softmax(q k^T * scale + mask) v, torch SDPA semantics; differentiable in q, k, v.

    q [b, hq, sq, d]; k, v [b, hkv, skv, d] with hq % hkv == 0 (GQA); mask broadcastable
    to [b, hq, sq, skv], bool (True = keep) or additive float; causal is top-left
    aligned; scale defaults to 1/sqrt(d). ``q_segment_ids [b, sq]``, ``kv_segment_ids
    [b, skv]`` (integers, packed sequences): a query attends only to keys of its own id.
    ``window`` (with causal): keys at most ``window - 1`` positions back. Blocks whose
    entries the structure masks entirely are skipped. ``block`` = (bq, bk), multiples of
    128. Rows with no kept key give 0.
    """
    cfg = _config(q, k, v, mask, causal, scale, dropout_p, block, interpret, q_segment_ids,
                  kv_segment_ids, window)
    return _attention(q, k, v, mask, q_segment_ids, kv_segment_ids, cfg)


def flash_attention_fwd(q: jax.Array, k: jax.Array, v: jax.Array,
                        mask: jax.Array | None = None, *, causal: bool = False,
                        scale: float | None = None, dropout_p: float = 0.0,
                        block: Blocks | None = None,
                        interpret: bool | None = None) -> tuple[jax.Array, jax.Array]:
    """Forward only: (out [b, hq, sq, d], logsumexp [b, hq, sq] f32; -inf on rows with
    no kept key), for ops that return the logsumexp. Not differentiable."""
    cfg = _config(q, k, v, mask, causal, scale, dropout_p, block, interpret, None, None, None)
    qp, kp, vp, seg, mp, tables = fb.prepare(q, k, v, mask, None, None, cfg.lay, cfg.causal, cfg.window)
    o, lse = fk.fwd(qp, kp, vp, seg, mp, tables, cfg)      # no segment ids here: seg None
    return o[:, :, :cfg.lay.sq], lse[:, :, 0, :cfg.lay.sq]


def flash_attention_bwd(do: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array,
                        out: jax.Array, lse: jax.Array, mask: jax.Array | None = None, *,
                        causal: bool = False, scale: float | None = None,
                        block: Blocks | None = None, interpret: bool | None = None,
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Backward from the saved forward (``out``, ``lse [b, hq, sq]``) -> (dq, dk, dv), for
    ops that keep the logsumexp between passes (aten's flash attention backward)."""
    cfg = _config(q, k, v, mask, causal, scale, 0.0, block, interpret, None, None, None)
    padded = fb.prepare(q, k, v, mask, None, None, cfg.lay, cfg.causal, cfg.window)
    qp = padded[0]
    op = pad_to(out.astype(q.dtype), qp.shape)
    # padded rows get lse 0: their scores are 0 and their output grads 0, so they add nothing
    lsep = pad_to(lse.astype(jnp.float32), qp.shape[:3])
    return _backward(cfg, padded, op, lsep, do)
