"""Flash attention (forward + backward) as Pallas TPU kernels.

Forward, per (batch, q head, q block i), streaming kv blocks j (reduction axis, last),
only over j in the block table's range for i (other steps compute and fetch nothing):

    s   = (Q_i K_j^T) * scale (+ additive mask); masked entries -> NEG
    m'  = max(m, rowmax(s));  p = exp(s - m') on kept entries, 0 elsewhere
    l   = exp(m - m') l + rowsum(p);  acc = exp(m - m') acc + p V_j;  m = m'
    O_i = acc / l,  LSE_i = m + log l      (rows with nothing kept: O = 0, LSE = -inf)

Backward recomputes p = exp(s - LSE) blockwise, with delta = rowsum(dO * O):

    dV_j += p^T dO_i;  dS = p (dO_i V_j^T - delta);  dK_j += scale dS^T Q_i;  dQ_i += scale dS K_j

dK/dV run one kernel per kv block whose reduction axis walks (q head of the kv group, q
block), so grouped-query attention sums over the group without repeating K/V; dQ runs a
second kernel that walks kv blocks.

Kept entries: kv index < skv; causal (top-left, torch's ``is_causal``: col <= row);
sliding ``window`` (row - col < window); equal segment ids (packed sequences); a dense
mask (bool, or additive float where -inf masks). The structural ones are computed from
iota in the kernel and give the block tables (``flash_blocks.py``) that skip blocks.
Blocks span the whole head dim (no padding: a block dim equal to the array dim is legal);
sequences pad to their blocks (the kv tail is masked). Statistics are f32 and
lane-replicated (bq, 128), the TPU-friendly layout.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import flash_blocks as fb
from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.flash_blocks import LANES, SUBLANES, Blocks, choose_blocks, vmem_bytes
from tpu_kernels.pallas.launch import cost, pad_to, pallas_call

__all__ = ["flash_attention", "flash_attention_fwd", "flash_attention_bwd", "supports",
           "choose_blocks", "vmem_bytes", "Blocks"]

NEG = -1e30                # finite "minus infinity": keeps exp(m_prev - m_new) NaN-free
MAX_HEAD_DIM = 512
_NT = (((1,), (1,)), ((), ()))   # a @ b^T
_SUPPORTED = ("float32", "bfloat16")
_SEMANTICS = ("parallel", "parallel", "parallel", "arbitrary")


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


@dataclasses.dataclass(frozen=True)
class _Cfg:
    """Static options of one call (hashable: a custom_vjp nondiff argument)."""
    causal: bool
    window: int | None
    scale: float
    lay: fb.Layout
    target: tpu_info.Target


# --- kernel bodies ----------------------------------------------------------------------

def _scores(q, k, mask, seg, *, row0, col0, cfg: _Cfg):
    """s = q k^T * scale (+ additive mask) in f32, and the kept-entry mask (None: all)."""
    prec = _precision(q.dtype)
    s = jax.lax.dot_general(q, k, _NT, precision=prec,
                            preferred_element_type=jnp.float32) * cfg.scale
    keep = None

    def both(a, b_):
        return b_ if a is None else a & b_

    cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1) + col0
    rows = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0) + row0
    if cfg.lay.skv % s.shape[1]:            # padded kv tail
        keep = both(keep, cols < cfg.lay.skv)
    if cfg.causal:
        keep = both(keep, cols <= rows)
    if cfg.window is not None:
        keep = both(keep, rows - cols < cfg.window)
    if seg is not None:                     # (bq, 128) lane- and (8, bk) sublane-replicated
        keep = both(keep, seg[0][:, :1] == seg[1][:1, :])
    if mask is not None:
        if mask.dtype == jnp.int8:          # boolean mask, shipped as int8; compared in
            keep = both(keep, mask.astype(jnp.int32) != 0)   # 32-bit: the scores' layout
        else:                               # additive mask; -inf entries count as masked
            s = s + mask.astype(jnp.float32)
            keep = both(keep, s > NEG)
    if keep is not None:
        s = jnp.where(keep, s, NEG)
    return s, keep


def _exp_kept(x, keep):
    p = jnp.exp(x)
    return p if keep is None else jnp.where(keep, p, 0.0)


def _split(refs, n_in: int, has_seg: bool, has_mask: bool):
    """(fixed inputs, segment refs or None, mask ref or None, outputs + scratch)."""
    fixed, rest = refs[:n_in], refs[n_in:]
    seg = (rest[0], rest[1]) if has_seg else None
    rest = rest[2:] if has_seg else rest
    mask = rest[0] if has_mask else None
    return fixed, seg, mask, rest[1:] if has_mask else rest


def _read(seg, mask):
    """The (mask, segment ids) values for ``_scores``."""
    return (None if mask is None else mask[...],
            None if seg is None else (seg[0][...], seg[1][...]))


def _fwd_kernel(lo_ref, hi_ref, *refs, cfg, has_seg, has_mask, batched):
    (q_ref, k_ref, v_ref), seg, mask_ref, (o_ref, lse_ref, m_sc, l_sc, acc_sc) = _split(
        refs, 3, has_seg, has_mask)
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    row = _row(b, i, cfg.lay.nq, batched)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full_like(m_sc, NEG)
        l_sc[...] = jnp.zeros_like(l_sc)
        acc_sc[...] = jnp.zeros_like(acc_sc)

    @pl.when(fb.in_range(lo_ref[row], hi_ref[row], j))
    def _step():
        s, keep = _scores(q_ref[...], k_ref[...], *_read(seg, mask_ref),
                          row0=i * cfg.lay.bq, col0=j * cfg.lay.bk, cfg=cfg)
        m_prev = m_sc[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        p = _exp_kept(s - m_new[:, :1], keep)
        alpha = jnp.exp(m_prev - m_new)
        l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=1, keepdims=True)
        m_sc[...] = m_new
        v = v_ref[...]
        acc_sc[...] = alpha[:, :1] * acc_sc[...] + jnp.dot(
            p.astype(v.dtype), v, precision=_precision(v.dtype),
            preferred_element_type=jnp.float32)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        l = l_sc[...]
        o_ref[...] = (acc_sc[...] / jnp.where(l == 0, 1.0, l)[:, :1]).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(l > 0, m_sc[...] + jnp.log(jnp.where(l > 0, l, 1.0)),
                                 -jnp.inf)


def _bwd_terms(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, seg, mask_ref, *, row0,
               col0, cfg):
    """p and dS = p (dO V^T - delta) for one (q block, kv block), f32."""
    s, keep = _scores(q_ref[...], k_ref[...], *_read(seg, mask_ref), row0=row0, col0=col0,
                      cfg=cfg)
    p = _exp_kept(s - lse_ref[...][:, :1], keep)
    dp = jax.lax.dot_general(do_ref[...], v_ref[...], _NT, precision=_precision(v_ref.dtype),
                             preferred_element_type=jnp.float32)
    return p, p * (dp - delta_ref[...][:, :1])


def _dq_kernel(lo_ref, hi_ref, *refs, cfg, has_seg, has_mask, batched):
    ins, seg, mask_ref, (dq_ref, acc_sc) = _split(refs, 6, has_seg, has_mask)
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    row = _row(b, i, cfg.lay.nq, batched)

    @pl.when(j == 0)
    def _init():
        acc_sc[...] = jnp.zeros_like(acc_sc)

    @pl.when(fb.in_range(lo_ref[row], hi_ref[row], j))
    def _step():
        _, ds = _bwd_terms(*ins, seg, mask_ref, row0=i * cfg.lay.bq, col0=j * cfg.lay.bk,
                           cfg=cfg)
        k = ins[1][...]
        acc_sc[...] += jnp.dot(ds.astype(k.dtype), k, precision=_precision(k.dtype),
                               preferred_element_type=jnp.float32)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (acc_sc[...] * cfg.scale).astype(dq_ref.dtype)


def _dkv_kernel(lo_ref, hi_ref, *refs, cfg, has_seg, has_mask, batched):
    ins, seg, mask_ref, (dk_ref, dv_ref, dk_sc, dv_sc) = _split(refs, 6, has_seg, has_mask)
    b, j, t = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    i = _rem(t, cfg.lay.nq)                       # t walks (q head in group, q block)
    col = _row(b, j, cfg.lay.nk, batched)

    @pl.when(t == 0)
    def _init():
        dk_sc[...] = jnp.zeros_like(dk_sc)
        dv_sc[...] = jnp.zeros_like(dv_sc)

    @pl.when(fb.in_range(lo_ref[col], hi_ref[col], i))
    def _step():
        p, ds = _bwd_terms(*ins, seg, mask_ref, row0=i * cfg.lay.bq, col0=j * cfg.lay.bk,
                           cfg=cfg)
        q, do = ins[0][...], ins[3][...]
        prec = _precision(q.dtype)
        dv_sc[...] += jnp.dot(p.T.astype(do.dtype), do, precision=prec,
                              preferred_element_type=jnp.float32)
        dk_sc[...] += jnp.dot(ds.T.astype(q.dtype), q, precision=prec,
                              preferred_element_type=jnp.float32)

    @pl.when(t == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = (dk_sc[...] * cfg.scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


# --- index helpers ----------------------------------------------------------------------

def _div(a, b: int):
    """Truncating a / b for non-negative int32 grid indices (lax.div, not //: floor
    division lowers through sign, which Mosaic resolves against the local device; the
    constant is typed so it stays int32 under jax_enable_x64)."""
    return jax.lax.div(a, jnp.asarray(b, a.dtype))


def _rem(a, b: int):
    return jax.lax.rem(a, jnp.asarray(b, a.dtype))


def _row(b, i, n: int, batched: bool):
    """Flat block-table index of (batch b, block i): tables are per batch or shared."""
    return b * n + i if batched else i


def _precision(dtype):
    return (jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32
            else jax.lax.Precision.DEFAULT)


# --- BlockSpecs, grids, pallas_calls, cost -------------------------------------------------

def _cost(q, k, mask, seg, cfg: _Cfg, fraction: float, *, matmuls: int, q_major: bool):
    """``matmuls`` (sq x d x skv) products and one exp per score of a needed block
    (``fraction`` of all blocks); HBM traffic: the outer operand once, the streamed one
    once per outer block over the needed blocks (kv streamed past q blocks for the forward
    and dq, q and dO streamed past kv blocks for dK/dV). Padding included."""
    b, hq, sqp, d = q.shape
    hkv, skvp = k.shape[1], k.shape[2]
    lay = cfg.lay
    scores = b * hq * sqp * skvp * fraction
    isz = q.dtype.itemsize
    stats = 2 * b * hq * sqp * LANES * 4                 # lse, delta (lse out in the fwd)
    if q_major:     # q, o (or q, dO, dq) once; k and v once per q block
        traffic = 3 * q.size * isz + 2 * k.size * isz * (hq // hkv) * lay.nq * fraction + stats
    else:           # k, v, dk, dv once; q, dO and the stats once per kv block
        traffic = 4 * k.size * isz + (2 * q.size * isz + stats) * lay.nk * fraction
    if mask is not None:
        traffic += mask.size * mask.dtype.itemsize * fraction
    if seg is not None:
        qs, ks = seg[0].size * 4, seg[1].size * 4
        traffic += (qs + ks * hq * lay.nq * fraction) if q_major else (ks + qs * hq * lay.nk * fraction)
    return cost(2 * matmuls * scores * d, traffic, scores)


def _extra_specs(seg, mask, bq, bk, batch_of, head_of, rows_of, cols_of):
    """BlockSpecs of the segment ids and of a [1|b, 1|hq, sqp, skvp] mask (broadcast dims
    always read block 0); index maps take (grid indices, lo_ref, hi_ref)."""
    specs = []
    if seg is not None:
        specs += [pl.BlockSpec((None, bq, LANES), lambda *a: (batch_of(*a), rows_of(*a), 0)),
                  pl.BlockSpec((None, SUBLANES, bk), lambda *a: (batch_of(*a), 0, cols_of(*a)))]
    if mask is not None:
        mb, mh = mask.shape[:2]
        specs.append(pl.BlockSpec(
            (None, None, bq, bk),
            lambda *a: (batch_of(*a) if mb > 1 else 0, head_of(*a) if mh > 1 else 0,
                        rows_of(*a), cols_of(*a))))
    return specs


def _q_major_specs(cfg: _Cfg, rep: int, d: int, seg, mask, batched: bool):
    """BlockSpecs of the kernels whose grid is (batch, q head, q block, kv block): the
    forward and dq. The kv head is the q head's group (GQA without repeated kv); steps
    outside the q block's kv range refetch the range's nearest end (no new copy)."""
    lay = cfg.lay

    def kvb(b_, h, i, j, lo, hi):
        r = _row(b_, i, lay.nq, batched)
        return fb.clamp(j, lo[r], hi[r])

    qspec = pl.BlockSpec((None, None, lay.bq, d), lambda b_, h, i, j, lo, hi: (b_, h, i, 0))
    kvspec = pl.BlockSpec((None, None, lay.bk, d),
                          lambda b_, h, i, j, lo, hi: (b_, _div(h, rep), kvb(b_, h, i, j, lo, hi), 0))
    stat = pl.BlockSpec((None, None, lay.bq, LANES), lambda b_, h, i, j, lo, hi: (b_, h, i, 0))
    extra = _extra_specs(seg, mask, lay.bq, lay.bk, lambda b_, *a: b_, lambda b_, h, *a: h,
                         lambda b_, h, i, *a: i, kvb)
    return qspec, kvspec, stat, extra


def _fwd_call(q, k, v, seg, mask, tables: fb.Tables, cfg: _Cfg):
    b, hq, sqp, d = q.shape
    rep, lay = hq // k.shape[1], cfg.lay
    qspec, kvspec, stat, extra = _q_major_specs(cfg, rep, d, seg, mask, tables.batched)
    kernel = functools.partial(_fwd_kernel, cfg=cfg, has_seg=seg is not None,
                               has_mask=mask is not None, batched=tables.batched)
    return pallas_call(
        kernel, target=cfg.target, name="flash_attention_fwd",
        cost_estimate=_cost(q, k, mask, seg, cfg, tables.fraction, matmuls=2, q_major=True),
        vmem_bytes=_vmem(q, mask, seg, cfg), dimension_semantics=_SEMANTICS,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(b, hq, lay.nq, lay.nk),
            in_specs=[qspec, kvspec, kvspec, *extra], out_specs=[qspec, stat],
            scratch_shapes=[pltpu.VMEM((lay.bq, LANES), jnp.float32),
                            pltpu.VMEM((lay.bq, LANES), jnp.float32),
                            pltpu.VMEM((lay.bq, d), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((b, hq, sqp, LANES), jnp.float32)],
    )(tables.row_lo, tables.row_hi, q, k, v, *_extras(seg, mask))


def _dq_call(q, k, v, do, lse, delta, seg, mask, tables: fb.Tables, cfg: _Cfg):
    b, hq, _, d = q.shape
    rep, lay = hq // k.shape[1], cfg.lay
    qspec, kvspec, stat, extra = _q_major_specs(cfg, rep, d, seg, mask, tables.batched)
    kernel = functools.partial(_dq_kernel, cfg=cfg, has_seg=seg is not None,
                               has_mask=mask is not None, batched=tables.batched)
    return pallas_call(
        kernel, target=cfg.target, name="flash_attention_dq",
        cost_estimate=_cost(q, k, mask, seg, cfg, tables.fraction, matmuls=3, q_major=True),
        vmem_bytes=_vmem(q, mask, seg, cfg), dimension_semantics=_SEMANTICS,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(b, hq, lay.nq, lay.nk),
            in_specs=[qspec, kvspec, kvspec, qspec, stat, stat, *extra], out_specs=qspec,
            scratch_shapes=[pltpu.VMEM((lay.bq, d), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    )(tables.row_lo, tables.row_hi, q, k, v, do, lse, delta, *_extras(seg, mask))


def _dkv_call(q, k, v, do, lse, delta, seg, mask, tables: fb.Tables, cfg: _Cfg):
    b, hq, _, d = q.shape
    hkv, lay = k.shape[1], cfg.lay
    rep, nq, batched = hq // hkv, lay.nq, tables.batched

    def head(b_, g, j, t, lo, hi):          # q head of step t in kv head g's group
        return g * rep + _div(t, nq)

    def qblk(b_, g, j, t, lo, hi):          # steps outside kv block j's q range repeat an end
        c = _row(b_, j, lay.nk, batched)
        return fb.clamp(_rem(t, nq), lo[c], hi[c])

    qspec = pl.BlockSpec((None, None, lay.bq, d), lambda *a: (a[0], head(*a), qblk(*a), 0))
    stat = pl.BlockSpec((None, None, lay.bq, LANES), lambda *a: (a[0], head(*a), qblk(*a), 0))
    kvspec = pl.BlockSpec((None, None, lay.bk, d), lambda b_, g, j, t, lo, hi: (b_, g, j, 0))
    extra = _extra_specs(seg, mask, lay.bq, lay.bk, lambda b_, *a: b_, head, qblk,
                         lambda b_, g, j, *a: j)
    kernel = functools.partial(_dkv_kernel, cfg=cfg, has_seg=seg is not None,
                               has_mask=mask is not None, batched=batched)
    return pallas_call(
        kernel, target=cfg.target, name="flash_attention_dkv",
        cost_estimate=_cost(q, k, mask, seg, cfg, tables.fraction, matmuls=4, q_major=False),
        vmem_bytes=_vmem(q, mask, seg, cfg), dimension_semantics=_SEMANTICS,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(b, hkv, lay.nk, rep * nq),
            in_specs=[qspec, kvspec, kvspec, qspec, stat, stat, *extra],
            out_specs=[kvspec, kvspec],
            scratch_shapes=[pltpu.VMEM((lay.bk, d), jnp.float32),
                            pltpu.VMEM((lay.bk, d), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
    )(tables.col_lo, tables.col_hi, q, k, v, do, lse, delta, *_extras(seg, mask))


def _extras(seg, mask) -> list:
    return [*(seg or ()), *([] if mask is None else [mask])]


def _vmem(q, mask, seg, cfg: _Cfg) -> int:
    msz = 0 if mask is None else mask.dtype.itemsize
    return vmem_bytes((cfg.lay.bq, cfg.lay.bk), q.shape[3], q.dtype, msz, seg is not None)


# --- wrapper: padding, tables, custom_vjp ---------------------------------------------------

def _prepare(q, k, v, mask, q_ids, kv_ids, cfg: _Cfg):
    """Sequence-padded operands, segment ids and mask as the kernels read them, tables."""
    lay = cfg.lay
    qp = pad_to(q, q.shape[:2] + (lay.sqp, q.shape[3]))
    kp, vp = (pad_to(x, x.shape[:2] + (lay.skvp, x.shape[3])) for x in (k, v))
    seg = fb.prep_segments(q_ids, kv_ids, lay)
    mp = fb.prep_mask(mask, q.shape[0], q.shape[1], lay)
    tables = fb.tables(lay, cfg.causal, cfg.window, q_ids, kv_ids)
    return qp, kp, vp, (None if seg[0] is None else seg), mp, tables


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attention(q, k, v, mask, q_ids, kv_ids, cfg):
    qp, kp, vp, seg, mp, tables = _prepare(q, k, v, mask, q_ids, kv_ids, cfg)
    o, _ = _fwd_call(qp, kp, vp, seg, mp, tables, cfg)
    return o[:, :, :q.shape[2]]


def _attention_fwd(q, k, v, mask, q_ids, kv_ids, cfg):
    qp, kp, vp, seg, mp, tables = _prepare(q, k, v, mask, q_ids, kv_ids, cfg)
    o, lse = _fwd_call(qp, kp, vp, seg, mp, tables, cfg)
    return o[:, :, :q.shape[2]], ((qp, kp, vp, seg, mp, tables), o, lse, mask, q_ids, kv_ids)


def _backward(cfg: _Cfg, padded, o, lse, g):
    """(dq, dk, dv) at the true lengths from padded operands and the padded forward."""
    qp, kp, vp, seg, mp, tables = padded
    do = pad_to(g.astype(qp.dtype), qp.shape)
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
    delta = jnp.broadcast_to(delta, lse.shape)          # lane-replicated like lse
    dq = _dq_call(qp, kp, vp, do, lse, delta, seg, mp, tables, cfg)
    dk, dv = _dkv_call(qp, kp, vp, do, lse, delta, seg, mp, tables, cfg)
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
            window) -> _Cfg:
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
    return _Cfg(bool(causal), window, scale, fb.Layout(sq, skv, bq, bk), target)


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
    qp, kp, vp, seg, mp, tables = _prepare(q, k, v, mask, None, None, cfg)
    o, lse = _fwd_call(qp, kp, vp, seg, mp, tables, cfg)
    return o[:, :, :cfg.lay.sq], lse[:, :, :cfg.lay.sq, 0]


def flash_attention_bwd(do: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array,
                        out: jax.Array, lse: jax.Array, mask: jax.Array | None = None, *,
                        causal: bool = False, scale: float | None = None,
                        block: Blocks | None = None, interpret: bool | None = None,
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Backward from the saved forward (``out``, ``lse [b, hq, sq]``) -> (dq, dk, dv), for
    ops that keep the logsumexp between passes (aten's flash attention backward)."""
    cfg = _config(q, k, v, mask, causal, scale, 0.0, block, interpret, None, None, None)
    padded = _prepare(q, k, v, mask, None, None, cfg)
    qp = padded[0]
    op = pad_to(out.astype(q.dtype), qp.shape)
    # padded rows get lse 0: their scores are 0 and their output grads 0, so they add nothing
    lsep = jnp.broadcast_to(pad_to(lse.astype(jnp.float32)[..., None], qp.shape[:3] + (1,)),
                            qp.shape[:3] + (LANES,))
    return _backward(cfg, padded, op, lsep, do)
