"""The three flash attention kernels (forward, dQ, dK/dV): bodies, BlockSpecs and grids,
cost estimates. The op around them (supports, padding, custom_vjp): ``flash_attention.py``;
blocks, block tables and masks: ``flash_blocks.py``.

Forward, per (batch, q head, q block i), streaming kv blocks j (reduction axis, last),
only over j in the block table's range for i (other steps compute and fetch nothing):

    s   = (Q_i K_j^T) * scale (+ additive mask); masked entries -> NEG
    m'  = max(m, rowmax(s));  p = exp(s - m') on kept entries, 0 elsewhere
    l   = exp(m - m') l + rowsum(p);  acc = exp(m - m') acc + p V_j;  m = m'
    O_i = acc / l,  LSE_i = m + log l      (rows with nothing kept: O = 0, LSE = -inf)

Backward recomputes p = exp(s - LSE) blockwise, with delta = rowsum(dO * O):

    dV_j += p^T dO_i;  dS = p (dO_i V_j^T - delta);  dK_j += scale dS^T Q_i;  dQ_i += scale dS K_j

dK/dV run one kernel per kv block whose reduction axis walks (q head of the kv group, q
block) over the kv block's q range, so grouped-query attention sums over the group
without repeating K/V; dQ runs a second kernel that walks kv blocks. Blocks span the
whole head dim (a block dim equal to the array dim is legal: no padding). Statistics
are f32: (bq, 128) lane-replicated columns in the forward and dQ (read once per q block),
(8, bq) sublane-replicated rows in dK/dV (read once per kv block), which therefore works
on s^T, p^T, dS^T (bk, bq).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import flash_blocks as fb
from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.flash_blocks import LANES, SUBLANES, vmem_bytes
from tpu_kernels.pallas.launch import cost, pallas_call

NEG = -1e30                # finite "minus infinity": keeps exp(m_prev - m_new) NaN-free
_NT = (((1,), (1,)), ((), ()))   # a @ b^T
_SEMANTICS = ("parallel", "parallel", "parallel", "arbitrary")


@dataclasses.dataclass(frozen=True)
class Config:
    """Static options of one call (hashable: a custom_vjp nondiff argument)."""
    causal: bool
    window: int | None
    scale: float
    lay: fb.Layout
    target: tpu_info.Target


# --- kernel bodies ----------------------------------------------------------------------

def _scores(q, k, mask, seg, *, row0, col0, cfg: Config, transposed: bool = False):
    """s = q k^T * scale (+ additive mask) in f32, and the kept-entry mask (None: all).
    ``transposed``: s^T = k q^T (bk, bq), q positions along lanes (the dK/dV kernel, whose
    row statistics then arrive as sublane-replicated rows)."""
    prec = tpu_info.mxu_precision(q.dtype)
    a, b = (k, q) if transposed else (q, k)
    s = jax.lax.dot_general(a, b, _NT, precision=prec,
                            preferred_element_type=jnp.float32) * cfg.scale
    keep = None

    def both(x, y):
        return y if x is None else x & y

    qdim, kdim = (1, 0) if transposed else (0, 1)
    cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, kdim) + col0
    rows = jax.lax.broadcasted_iota(jnp.int32, s.shape, qdim) + row0
    if cfg.lay.skv % s.shape[kdim]:         # padded kv tail
        keep = both(keep, cols < cfg.lay.skv)
    if cfg.causal:
        keep = both(keep, cols <= rows)
    if cfg.window is not None:
        keep = both(keep, rows - cols < cfg.window)
    if seg is not None:      # (bq, 128) lane- and (8, bk) sublane-replicated, or transposed
        keep = both(keep, seg[0][:, :1] == seg[1][:1, :])
    if mask is not None:
        if mask.dtype == jnp.int8:          # boolean mask, shipped as int8; compared in
            m = mask.astype(jnp.int32)      # 32-bit: the scores' layout
            keep = both(keep, (m.T if transposed else m) != 0)
        else:                               # additive mask; -inf entries count as masked
            m = mask.astype(jnp.float32)
            s = s + (m.T if transposed else m)
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
    row = fb.row(b, i, cfg.lay.nq, batched)

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
            p.astype(v.dtype), v, precision=tpu_info.mxu_precision(v.dtype),
            preferred_element_type=jnp.float32)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        l = l_sc[...]
        o_ref[...] = (acc_sc[...] / jnp.where(l == 0, 1.0, l)[:, :1]).astype(o_ref.dtype)
        lse = jnp.where(l > 0, m_sc[...] + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)
        lse_ref[...] = lse.T[:SUBLANES, :]      # (bq, 128) columns -> (8, bq) rows


def _bwd_terms(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, seg, mask_ref, *, row0,
               col0, cfg, transposed: bool = False):
    """p and dS = p (dO V^T - delta) for one (q block, kv block), f32; ``transposed``:
    p^T and dS^T (bk, bq) from row statistics (8, bq)."""
    s, keep = _scores(q_ref[...], k_ref[...], *_read(seg, mask_ref), row0=row0, col0=col0,
                      cfg=cfg, transposed=transposed)
    a, b = (v_ref[...], do_ref[...]) if transposed else (do_ref[...], v_ref[...])
    dp = jax.lax.dot_general(a, b, _NT, precision=tpu_info.mxu_precision(v_ref.dtype),
                             preferred_element_type=jnp.float32)
    lse, delta = lse_ref[...], delta_ref[...]
    lse, delta = (lse[:1, :], delta[:1, :]) if transposed else (lse[:, :1], delta[:, :1])
    p = _exp_kept(s - lse, keep)
    return p, p * (dp - delta)


def _dq_kernel(lo_ref, hi_ref, *refs, cfg, has_seg, has_mask, batched):
    ins, seg, mask_ref, (dq_ref, acc_sc) = _split(refs, 6, has_seg, has_mask)
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    row = fb.row(b, i, cfg.lay.nq, batched)

    @pl.when(j == 0)
    def _init():
        acc_sc[...] = jnp.zeros_like(acc_sc)

    @pl.when(fb.in_range(lo_ref[row], hi_ref[row], j))
    def _step():
        _, ds = _bwd_terms(*ins, seg, mask_ref, row0=i * cfg.lay.bq, col0=j * cfg.lay.bk,
                           cfg=cfg)
        k = ins[1][...]
        acc_sc[...] += jnp.dot(ds.astype(k.dtype), k, precision=tpu_info.mxu_precision(k.dtype),
                               preferred_element_type=jnp.float32)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (acc_sc[...] * cfg.scale).astype(dq_ref.dtype)


def _dkv_kernel(lo_ref, hi_ref, *refs, cfg, has_seg, has_mask, batched):
    ins, seg, mask_ref, (dk_ref, dv_ref, dk_sc, dv_sc) = _split(refs, 6, has_seg, has_mask)
    b, j, t = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    i = fb.rem(t, cfg.lay.nq)                       # t walks (q head in group, q block)
    col = fb.row(b, j, cfg.lay.nk, batched)

    @pl.when(t == 0)
    def _init():
        dk_sc[...] = jnp.zeros_like(dk_sc)
        dv_sc[...] = jnp.zeros_like(dv_sc)

    @pl.when(fb.in_range(lo_ref[col], hi_ref[col], i))
    def _step():
        pt, dst = _bwd_terms(*ins, seg, mask_ref, row0=i * cfg.lay.bq, col0=j * cfg.lay.bk,
                             cfg=cfg, transposed=True)
        q, do = ins[0][...], ins[3][...]
        prec = tpu_info.mxu_precision(q.dtype)
        dv_sc[...] += jnp.dot(pt.astype(do.dtype), do, precision=prec,
                              preferred_element_type=jnp.float32)
        dk_sc[...] += jnp.dot(dst.astype(q.dtype), q, precision=prec,
                              preferred_element_type=jnp.float32)

    @pl.when(t == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = (dk_sc[...] * cfg.scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


# --- BlockSpecs, grids, pallas_calls, cost -------------------------------------------------

def _cost(q, k, mask, seg, cfg: Config, fraction: float, *, matmuls: int, q_major: bool):
    """``matmuls`` (sq x d x skv) products and one exp per score of a needed block
    (``fraction`` of all blocks); HBM traffic: the outer operand once, the streamed one
    once per outer block over the needed blocks (kv streamed past q blocks for the forward
    and dq, q and dO streamed past kv blocks for dK/dV). Padding included."""
    b, hq, sqp, d = q.shape
    hkv, skvp = k.shape[1], k.shape[2]
    lay = cfg.lay
    scores = b * hq * sqp * skvp * fraction
    isz = q.dtype.itemsize
    if q_major:     # q, o (or q, dO, dq) once; k and v once per q block; the forward writes
        # lse as (8, bq) rows, dq reads lse and delta as (bq, 128) columns
        stats = SUBLANES * 4 if matmuls == 2 else 2 * LANES * 4
        traffic = (3 * q.size * isz + 2 * k.size * isz * (hq // hkv) * lay.nq * fraction
                   + b * hq * sqp * stats)
    else:           # k, v, dk, dv once; q, dO and lse, delta (8, bq) once per kv block
        stats = 2 * b * hq * sqp * SUBLANES * 4
        traffic = 4 * k.size * isz + (2 * q.size * isz + stats) * lay.nk * fraction
    if mask is not None:
        traffic += mask.size * mask.dtype.itemsize * fraction
    if seg is not None:     # the streamed side's ids once per outer block and head
        qs, ks = (seg[0].size * 4, seg[1].size * 4) if q_major else (seg[1].size * 4, seg[0].size * 4)
        traffic += (qs + ks * hq * lay.nq * fraction) if q_major else (ks + qs * hq * lay.nk * fraction)
    return cost(2 * matmuls * scores * d, traffic, scores)


def _q_major_specs(cfg: Config, rep: int, d: int, seg, mask, batched: bool):
    """BlockSpecs of the kernels whose grid is (batch, q head, q block, kv block): the
    forward and dq. The kv head is the q head's group (GQA without repeated kv); steps
    outside the q block's kv range refetch the range's nearest end (no new copy)."""
    lay = cfg.lay

    def kvb(b_, h, i, j, lo, hi):
        r = fb.row(b_, i, lay.nq, batched)
        return fb.clamp(j, lo[r], hi[r])

    qspec = pl.BlockSpec((None, None, lay.bq, d), lambda b_, h, i, j, lo, hi: (b_, h, i, 0))
    kvspec = pl.BlockSpec((None, None, lay.bk, d),
                          lambda b_, h, i, j, lo, hi: (b_, fb.div(h, rep), kvb(b_, h, i, j, lo, hi), 0))
    stat = pl.BlockSpec((None, None, lay.bq, LANES), lambda b_, h, i, j, lo, hi: (b_, h, i, 0))
    extra = fb.extra_specs(seg, mask, lay.bq, lay.bk, lambda b_, *a: b_, lambda b_, h, *a: h,
                         lambda b_, h, i, *a: i, kvb)
    return qspec, kvspec, stat, extra


def fwd(q, k, v, seg, mask, tables: fb.Tables, cfg: Config):
    b, hq, sqp, d = q.shape
    rep, lay = hq // k.shape[1], cfg.lay
    qspec, kvspec, stat, extra = _q_major_specs(cfg, rep, d, seg, mask, tables.batched)
    lse_rows = pl.BlockSpec((None, None, SUBLANES, lay.bq),
                            lambda b_, h, i, j, lo, hi: (b_, h, 0, i))
    return _launch(
        _fwd_kernel, "flash_attention_fwd", cfg, tables, (b, hq, lay.nq, lay.nk),
        [qspec, kvspec, kvspec, *extra], [qspec, lse_rows],
        [jax.ShapeDtypeStruct(q.shape, q.dtype),
         jax.ShapeDtypeStruct((b, hq, SUBLANES, sqp), jnp.float32)],
        [pltpu.VMEM((lay.bq, LANES), jnp.float32), pltpu.VMEM((lay.bq, LANES), jnp.float32),
         pltpu.VMEM((lay.bq, d), jnp.float32)],
        _cost(q, k, mask, seg, cfg, tables.fraction, matmuls=2, q_major=True),
        [q, k, v], seg, mask)


def dq(q, k, v, do, lse, delta, seg, mask, tables: fb.Tables, cfg: Config):
    b, hq, _, d = q.shape
    rep, lay = hq // k.shape[1], cfg.lay
    qspec, kvspec, stat, extra = _q_major_specs(cfg, rep, d, seg, mask, tables.batched)
    return _launch(
        _dq_kernel, "flash_attention_dq", cfg, tables, (b, hq, lay.nq, lay.nk),
        [qspec, kvspec, kvspec, qspec, stat, stat, *extra], qspec,
        jax.ShapeDtypeStruct(q.shape, q.dtype), [pltpu.VMEM((lay.bq, d), jnp.float32)],
        _cost(q, k, mask, seg, cfg, tables.fraction, matmuls=3, q_major=True),
        [q, k, v, do, lse, delta], seg, mask)


def dkv(q, k, v, do, lse, delta, seg, mask, tables: fb.Tables, cfg: Config):
    """dK, dV with s^T, p^T, dS^T (bk, bq) per step: lse and delta [b, hq, 8, sqp] arrive
    as sublane-replicated rows (32 bytes a q row per kv block, not 1 KiB of lane-replicated
    columns), and both updates are plain (bk, bq) x (bq, d) products (no transposes)."""
    b, hq, _, d = q.shape
    hkv, lay = k.shape[1], cfg.lay
    rep, nq, batched = hq // hkv, lay.nq, tables.batched

    def head(b_, g, j, t, lo, hi):          # q head of step t in kv head g's group
        return g * rep + fb.div(t, nq)

    def qblk(b_, g, j, t, lo, hi):          # steps outside kv block j's q range repeat an end
        c = fb.row(b_, j, lay.nk, batched)
        return fb.clamp(fb.rem(t, nq), lo[c], hi[c])

    qspec = pl.BlockSpec((None, None, lay.bq, d), lambda *a: (a[0], head(*a), qblk(*a), 0))
    stat = pl.BlockSpec((None, None, SUBLANES, lay.bq),    # row statistics (8, bq)
                        lambda *a: (a[0], head(*a), 0, qblk(*a)))
    kvspec = pl.BlockSpec((None, None, lay.bk, d), lambda b_, g, j, t, lo, hi: (b_, g, j, 0))
    extra = fb.extra_specs(seg, mask, lay.bq, lay.bk, lambda b_, *a: b_, head, qblk,
                           lambda b_, g, j, *a: j, transposed=True)
    return _launch(
        _dkv_kernel, "flash_attention_dkv", cfg, tables, (b, hkv, lay.nk, rep * nq),
        [qspec, kvspec, kvspec, qspec, stat, stat, *extra], [kvspec, kvspec],
        [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        [pltpu.VMEM((lay.bk, d), jnp.float32), pltpu.VMEM((lay.bk, d), jnp.float32)],
        _cost(q, k, mask, seg, cfg, tables.fraction, matmuls=4, q_major=False),
        [q, k, v, do, lse, delta], seg, mask)


def _launch(body, name, cfg: Config, tables: fb.Tables, grid, in_specs, out_specs, out_shape,
            scratch, cost_estimate, args, seg, mask):
    """One pallas_call: the row tables (or, for dK/dV, the column tables) scalar-prefetched
    ahead of ``args``, the segment ids and the mask."""
    kernel = functools.partial(body, cfg=cfg, has_seg=seg is not None,
                               has_mask=mask is not None, batched=tables.batched)
    lo, hi = ((tables.col_lo, tables.col_hi) if name == "flash_attention_dkv"
              else (tables.row_lo, tables.row_hi))
    msz = 0 if mask is None else mask.dtype.itemsize
    return pallas_call(
        kernel, target=cfg.target, name=name, cost_estimate=cost_estimate,
        vmem_bytes=vmem_bytes((cfg.lay.bq, cfg.lay.bk), args[0].shape[3], args[0].dtype, msz,
                              seg is not None),
        dimension_semantics=_SEMANTICS,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=grid, in_specs=in_specs, out_specs=out_specs,
            scratch_shapes=scratch),
        out_shape=out_shape,
    )(lo, hi, *args, *(seg or ()), *([] if mask is None else [mask]))
