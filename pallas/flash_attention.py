"""Flash attention (forward + backward) as Pallas TPU kernels.

Forward, per (batch, q head, q block i), streaming kv blocks j (reduction axis, last):

    s   = (Q_i K_j^T) * scale (+ additive mask); masked entries -> NEG
    m'  = max(m, rowmax(s));  p = exp(s - m') on kept entries, 0 elsewhere
    l   = exp(m - m') l + rowsum(p);  acc = exp(m - m') acc + p V_j;  m = m'
    O_i = acc / l,  LSE_i = m + log l      (rows with nothing kept: O = 0, LSE = -inf)

Backward recomputes p = exp(s - LSE) blockwise, with delta = rowsum(dO * O):

    dV_j += p^T dO_i;  dS = p (dO_i V_j^T - delta);  dK_j += scale dS^T Q_i;  dQ_i += scale dS K_j

dK/dV run one kernel per kv block whose reduction axis walks (q head of the kv group, q
block), so grouped-query attention sums over the group without repeating K/V; dQ runs a
second kernel that walks kv blocks. Causal masks are top-left aligned (torch's
``is_causal``: keep col <= row); blocks above the diagonal are skipped and their index
maps clamped so they fetch nothing new. The wrapper pads head_dim to a multiple of 128
and sequences to block multiples (the kv tail is masked) and slices back. Statistics are
f32 and lane-replicated (bq, 128), the TPU-friendly layout.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info, tuned
from tpu_kernels.pallas.launch import cost, pad_to, pallas_call
from tpu_kernels.pallas.tpu_info import round_up

Blocks = tuple[int, int]   # (bq, bk)
LANES = 128
NEG = -1e30                # finite "minus infinity": keeps exp(m_prev - m_new) NaN-free
MAX_HEAD_DIM = 512
_NT = (((1,), (1,)), ((), ()))   # a @ b^T
_TABLE: dict[int, Blocks] = {128: (256, 512), 256: (512, 512)}   # by MXU width
_SUPPORTED = ("float32", "bfloat16")


# --- block sizes and VMEM -------------------------------------------------------------

def vmem_bytes(blocks: Blocks, head_dim: int, dtype, mask_itemsize: int = 0) -> int:
    """Largest VMEM footprint of the three kernels (fwd, dq, dkv): double-buffered
    blocks + f32 scratch + the f32 (bq, bk) temporaries of the body."""
    bq, bk = blocks
    d = round_up(head_dim, LANES)
    isz = jnp.dtype(dtype).itemsize
    stat = bq * LANES * 4                                  # one (bq, 128) f32 block
    mask = 2 * bq * bk * mask_itemsize
    fwd = (2 * (2 * bq * d + 2 * bk * d) * isz + 2 * stat   # q, o, k, v; lse out
           + 2 * stat + bq * d * 4 + 2 * bq * bk * 4 + mask)   # m, l, acc; s, p
    dq = (2 * (3 * bq * d + 2 * bk * d) * isz + 2 * 2 * stat  # q, do, dq, k, v; lse, delta
          + bq * d * 4 + 4 * bq * bk * 4 + mask)              # acc; s, p, dp, ds
    dkv = (2 * (2 * bq * d + 4 * bk * d) * isz + 2 * 2 * stat  # q, do, k, v, dk, dv
           + 2 * bk * d * 4 + 4 * bq * bk * 4 + mask)
    return max(fwd, dq, dkv)


def choose_blocks(sq: int, skv: int, head_dim: int, dtype, chip: tpu_info.Chip,
                  mask_itemsize: int = 0) -> Blocks:
    """The tuned table's entry (``tuned``; unmasked calls), else the one by MXU width,
    clamped to the padded sequences (multiples of 128, so every dot has >= 128 on its
    contracting and lane sides), halved until it fits."""
    hit = None if mask_itemsize else tuned.lookup_blocks(
        "flash_attention", chip, dtype, align=(LANES, LANES), sq=sq, skv=skv, d=head_dim)
    bq, bk = hit or _TABLE[128 if chip.mxu <= 128 else 256]
    bq, bk = min(bq, round_up(sq, LANES)), min(bk, round_up(skv, LANES))
    budget = tuned.vmem_budget(chip, hit)
    while vmem_bytes((bq, bk), head_dim, dtype, mask_itemsize) > budget:
        if bk >= bq and bk > LANES:
            bk //= 2
        elif bq > LANES:
            bq //= 2
        else:
            break
    return bq, bk


def supports(q_shape, q_dtype, k_shape, k_dtype, v_shape, v_dtype, mask_shape=None,
             mask_dtype=None, *, causal: bool = False, dropout_p: float = 0.0,
             scale: float | None = None) -> str | None:
    """None when the kernels handle these arguments, else the reason they do not."""
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


# --- kernel bodies ----------------------------------------------------------------------

def _scores(q, k, mask, *, row0, col0, scale, causal, skv, precision):
    """s = q k^T * scale (+ additive mask) in f32, and the kept-entry mask (None: all)."""
    s = jax.lax.dot_general(q, k, _NT, precision=precision,
                            preferred_element_type=jnp.float32) * scale
    keep = None

    def both(a, b_):
        return b_ if a is None else a & b_

    cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1) + col0
    if skv % s.shape[1]:                    # padded kv tail
        keep = both(keep, cols < skv)
    if causal:
        rows = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0) + row0
        keep = both(keep, cols <= rows)
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


def _causal_needed(i, j, bq, bk):
    """Some (row, col) of block (i, j) has col <= row."""
    return j * bk <= i * bq + bq - 1


def _fwd_kernel(q_ref, k_ref, v_ref, *rest, scale, causal, skv, bq, bk, precision, has_mask):
    mask_ref = rest[0] if has_mask else None
    o_ref, lse_ref, m_sc, l_sc, acc_sc = rest[1:] if has_mask else rest
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full_like(m_sc, NEG)
        l_sc[...] = jnp.zeros_like(l_sc)
        acc_sc[...] = jnp.zeros_like(acc_sc)

    def _step():
        s, keep = _scores(q_ref[...], k_ref[...], None if mask_ref is None else mask_ref[...],
                          row0=i * bq, col0=j * bk, scale=scale, causal=causal, skv=skv,
                          precision=precision)
        m_prev = m_sc[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        p = _exp_kept(s - m_new[:, :1], keep)
        alpha = jnp.exp(m_prev - m_new)
        l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=1, keepdims=True)
        m_sc[...] = m_new
        v = v_ref[...]
        acc_sc[...] = alpha[:, :1] * acc_sc[...] + jnp.dot(
            p.astype(v.dtype), v, precision=precision, preferred_element_type=jnp.float32)

    pl.when(_causal_needed(i, j, bq, bk) if causal else True)(_step)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        l = l_sc[...]
        o_ref[...] = (acc_sc[...] / jnp.where(l == 0, 1.0, l)[:, :1]).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(l > 0, m_sc[...] + jnp.log(jnp.where(l > 0, l, 1.0)),
                                 -jnp.inf)


def _bwd_terms(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, mask_ref, *, row0, col0,
               scale, causal, skv, precision):
    """p and dS = p (dO V^T - delta) for one (q block, kv block), f32."""
    s, keep = _scores(q_ref[...], k_ref[...], None if mask_ref is None else mask_ref[...],
                      row0=row0, col0=col0, scale=scale, causal=causal, skv=skv,
                      precision=precision)
    p = _exp_kept(s - lse_ref[...][:, :1], keep)
    dp = jax.lax.dot_general(do_ref[...], v_ref[...], _NT, precision=precision,
                             preferred_element_type=jnp.float32)
    return p, p * (dp - delta_ref[...][:, :1])


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *rest, scale, causal, skv,
               bq, bk, precision, has_mask):
    mask_ref = rest[0] if has_mask else None
    dq_ref, acc_sc = rest[1:] if has_mask else rest
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        acc_sc[...] = jnp.zeros_like(acc_sc)

    def _step():
        _, ds = _bwd_terms(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, mask_ref,
                           row0=i * bq, col0=j * bk, scale=scale, causal=causal, skv=skv,
                           precision=precision)
        k = k_ref[...]
        acc_sc[...] += jnp.dot(ds.astype(k.dtype), k, precision=precision,
                               preferred_element_type=jnp.float32)

    pl.when(_causal_needed(i, j, bq, bk) if causal else True)(_step)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (acc_sc[...] * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *rest, scale, causal, skv,
                bq, bk, nq, precision, has_mask):
    mask_ref = rest[0] if has_mask else None
    dk_ref, dv_ref, dk_sc, dv_sc = rest[1:] if has_mask else rest
    j, t = pl.program_id(2), pl.program_id(3)
    i = _rem(t, nq)                             # t walks (q head in group, q block)

    @pl.when(t == 0)
    def _init():
        dk_sc[...] = jnp.zeros_like(dk_sc)
        dv_sc[...] = jnp.zeros_like(dv_sc)

    def _step():
        p, ds = _bwd_terms(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, mask_ref,
                           row0=i * bq, col0=j * bk, scale=scale, causal=causal, skv=skv,
                           precision=precision)
        q, do = q_ref[...], do_ref[...]
        dv_sc[...] += jnp.dot(p.T.astype(do.dtype), do, precision=precision,
                              preferred_element_type=jnp.float32)
        dk_sc[...] += jnp.dot(ds.T.astype(q.dtype), q, precision=precision,
                              preferred_element_type=jnp.float32)

    pl.when(_causal_needed(i, j, bq, bk) if causal else True)(_step)

    @pl.when(t == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = (dk_sc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


# --- BlockSpecs, grids, pallas_calls ---------------------------------------------------

def _div(a, b: int):
    """Truncating a / b for non-negative int32 grid indices (lax.div, not //: floor
    division lowers through sign, which Mosaic resolves against the local device; the
    constant is typed so it stays int32 under jax_enable_x64)."""
    return jax.lax.div(a, jnp.asarray(b, a.dtype))


def _rem(a, b: int):
    return jax.lax.rem(a, jnp.asarray(b, a.dtype))


_SEMANTICS = ("parallel", "parallel", "parallel", "arbitrary")


def _cost(q, k, mask, blocks: Blocks, *, causal: bool, matmuls: int, q_major: bool):
    """``matmuls`` (sq x d x skv) products and one exp per kept score; HBM traffic: the
    outer operand once, the streamed one once per outer block (kv streamed past q blocks
    for the forward and dq, q and dO streamed past kv blocks for dK/dV)."""
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    kept = 0.5 if causal else 1.0
    scores = b * hq * sq * skv * kept
    isz = q.dtype.itemsize
    if q_major:     # q, o (or q, dO, dq) once; k and v once per q block
        traffic = 3 * q.size * isz + 2 * k.size * isz * (hq // hkv) * (sq // blocks[0]) * kept
    else:           # k, v, dk, dv once; q and dO once per kv block
        traffic = 4 * k.size * isz + 2 * q.size * isz * (skv // blocks[1]) * kept
    if mask is not None:
        traffic += mask.size * mask.dtype.itemsize
    return cost(2 * matmuls * scores * d, traffic, scores)


def _mask_spec(mask, bq, bk, head_of, rows_of, cols_of):
    """BlockSpec for a [1|b, 1|hq, sq, skv] mask; broadcast dims always read block 0."""
    mb, mh = mask.shape[:2]
    return pl.BlockSpec(
        (None, None, bq, bk),
        lambda b, x, y, z: (b if mb > 1 else 0, head_of(x, y, z) if mh > 1 else 0,
                            rows_of(x, y, z), cols_of(x, y, z)))


def _kv_block(causal, bq, bk):
    """kv block index to fetch at (q block i, step j): causal steps above the diagonal
    repeat the last needed block, so the pipeline issues no new copy for them."""
    if not causal:
        return lambda i, j: j
    return lambda i, j: jnp.minimum(j, _div(i * bq + bq - 1, bk))


def _q_major_specs(rep: int, blocks, causal: bool, d: int, mask):
    """BlockSpecs of the kernels whose grid is (batch, q head, q block, kv block): the
    forward and dq. The kv head is the q head's group (GQA without repeated kv)."""
    bq, bk = blocks
    kvb = _kv_block(causal, bq, bk)
    qspec = pl.BlockSpec((None, None, bq, d), lambda b_, h, i, j: (b_, h, i, 0))
    kvspec = pl.BlockSpec((None, None, bk, d),
                          lambda b_, h, i, j: (b_, _div(h, rep), kvb(i, j), 0))
    stat = pl.BlockSpec((None, None, bq, LANES), lambda b_, h, i, j: (b_, h, i, 0))
    mspec = None if mask is None else _mask_spec(
        mask, bq, bk, lambda h, i, j: h, lambda h, i, j: i, lambda h, i, j: kvb(i, j))
    return qspec, kvspec, stat, mspec


def _fwd_call(q, k, v, mask, *, scale, causal, skv, blocks, precision, target):
    b, hq, sqp, d = q.shape
    rep, skvp = hq // k.shape[1], k.shape[2]
    bq, bk = blocks
    qspec, kvspec, stat, mspec = _q_major_specs(rep, blocks, causal, d, mask)
    in_specs, args = [qspec, kvspec, kvspec], [q, k, v]
    if mask is not None:
        in_specs.append(mspec)
        args.append(mask)
    kernel = functools.partial(_fwd_kernel, scale=scale, causal=causal, skv=skv, bq=bq,
                               bk=bk, precision=precision, has_mask=mask is not None)
    return pallas_call(
        kernel,
        target=target,
        name="flash_attention_fwd",
        cost_estimate=_cost(q, k, mask, blocks, causal=causal, matmuls=2, q_major=True),
        vmem_bytes=vmem_bytes(blocks, d, q.dtype, _mask_itemsize(mask)),
        dimension_semantics=_SEMANTICS,
        grid=(b, hq, sqp // bq, skvp // bk),
        in_specs=in_specs,
        out_specs=[qspec, stat],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((b, hq, sqp, LANES), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((bq, LANES), jnp.float32),
                        pltpu.VMEM((bq, LANES), jnp.float32),
                        pltpu.VMEM((bq, d), jnp.float32)],
    )(*args)


def _dq_call(q, k, v, do, lse, delta, mask, *, scale, causal, skv, blocks, precision,
             target):
    b, hq, sqp, d = q.shape
    rep, skvp = hq // k.shape[1], k.shape[2]
    bq, bk = blocks
    qspec, kvspec, stat, mspec = _q_major_specs(rep, blocks, causal, d, mask)
    in_specs, args = [qspec, kvspec, kvspec, qspec, stat, stat], [q, k, v, do, lse, delta]
    if mask is not None:
        in_specs.append(mspec)
        args.append(mask)
    kernel = functools.partial(_dq_kernel, scale=scale, causal=causal, skv=skv, bq=bq,
                               bk=bk, precision=precision, has_mask=mask is not None)
    return pallas_call(
        kernel,
        target=target,
        name="flash_attention_dq",
        cost_estimate=_cost(q, k, mask, blocks, causal=causal, matmuls=3, q_major=True),
        vmem_bytes=vmem_bytes(blocks, d, q.dtype, _mask_itemsize(mask)),
        dimension_semantics=_SEMANTICS,
        grid=(b, hq, sqp // bq, skvp // bk),
        in_specs=in_specs,
        out_specs=qspec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((bq, d), jnp.float32)],
    )(*args)


def _dkv_call(q, k, v, do, lse, delta, mask, *, scale, causal, skv, blocks, precision,
              target):
    b, hq, sqp, d = q.shape
    hkv, skvp = k.shape[1], k.shape[2]
    rep = hq // hkv
    bq, bk = blocks
    nq = sqp // bq

    def head(g, j, t):              # q head of step t in kv head g's group
        return g * rep + _div(t, nq)

    def qblk(g, j, t):              # causal: skip-steps below the first needed q block
        i = _rem(t, nq)
        return jnp.minimum(jnp.maximum(i, _div(j * bk, bq)), nq - 1) if causal else i

    qspec = pl.BlockSpec((None, None, bq, d),
                         lambda b_, g, j, t: (b_, head(g, j, t), qblk(g, j, t), 0))
    stat = pl.BlockSpec((None, None, bq, LANES),
                        lambda b_, g, j, t: (b_, head(g, j, t), qblk(g, j, t), 0))
    kvspec = pl.BlockSpec((None, None, bk, d), lambda b_, g, j, t: (b_, g, j, 0))
    in_specs, args = [qspec, kvspec, kvspec, qspec, stat, stat], [q, k, v, do, lse, delta]
    if mask is not None:
        in_specs.append(_mask_spec(mask, bq, bk, head, qblk, lambda g, j, t: j))
        args.append(mask)
    kernel = functools.partial(_dkv_kernel, scale=scale, causal=causal, skv=skv, bq=bq,
                               bk=bk, nq=nq, precision=precision, has_mask=mask is not None)
    return pallas_call(
        kernel,
        target=target,
        name="flash_attention_dkv",
        cost_estimate=_cost(q, k, mask, blocks, causal=causal, matmuls=4, q_major=False),
        vmem_bytes=vmem_bytes(blocks, d, q.dtype, _mask_itemsize(mask)),
        dimension_semantics=_SEMANTICS,
        grid=(b, hkv, skvp // bk, rep * nq),
        in_specs=in_specs,
        out_specs=[kvspec, kvspec],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        scratch_shapes=[pltpu.VMEM((bk, d), jnp.float32), pltpu.VMEM((bk, d), jnp.float32)],
    )(*args)


# --- wrapper: padding, custom_vjp -------------------------------------------------------

def _mask_itemsize(mask) -> int:
    return 0 if mask is None else mask.dtype.itemsize


def _prep_mask(mask, b, hq, sq, skv, sqp, skvp):
    """Mask -> [1|b, 1|hq, sqp, skvp]: bool becomes int8 (1 = keep, padding 0); float
    stays additive (padding 0: the kv tail is masked by index anyway)."""
    if mask is None:
        return None
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    mask = jnp.broadcast_to(mask, mask.shape[:2] + (sq, skv))
    if mask.dtype == jnp.bool_:
        mask = mask.astype(jnp.int8)
    return pad_to(mask, mask.shape[:2] + (sqp, skvp))


def _precision(dtype):
    return (jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32
            else jax.lax.Precision.DEFAULT)


def _forward(q, k, v, mask, opts):
    """Padded forward: returns (out, lse) at padded shapes plus the padded operands."""
    causal, scale, blocks, target = opts
    b, hq, sq, d = q.shape
    skv = k.shape[2]
    dp = round_up(d, LANES)
    bq, bk = blocks
    sqp, skvp = round_up(sq, bq), round_up(skv, bk)
    qp = pad_to(q, (b, hq, sqp, dp))
    kp = pad_to(k, k.shape[:2] + (skvp, dp))
    vp = pad_to(v, v.shape[:2] + (skvp, dp))
    mp = _prep_mask(mask, b, hq, sq, skv, sqp, skvp)
    kw = dict(scale=scale, causal=causal, skv=skv, blocks=blocks,
              precision=_precision(q.dtype), target=target)
    o, lse = _fwd_call(qp, kp, vp, mp, **kw)
    return o, lse, (qp, kp, vp, mp), kw


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, mask, opts):
    o, _, _, _ = _forward(q, k, v, mask, opts)
    return o[:, :, :q.shape[2], :q.shape[3]]


def _attention_fwd(q, k, v, mask, opts):
    o, lse, padded, _ = _forward(q, k, v, mask, opts)
    return o[:, :, :q.shape[2], :q.shape[3]], (padded, o, lse, q.shape, k.shape)


def _attention_bwd(opts, res, g):
    (qp, kp, vp, mp), o, lse, qshape, kshape = res
    causal, scale, blocks, target = opts
    kw = dict(scale=scale, causal=causal, skv=kshape[2], blocks=blocks,
              precision=_precision(qp.dtype), target=target)
    do = pad_to(g.astype(qp.dtype), qp.shape)
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
    delta = jnp.broadcast_to(delta, lse.shape)          # lane-replicated like lse
    dq = _dq_call(qp, kp, vp, do, lse, delta, mp, **kw)
    dk, dv = _dkv_call(qp, kp, vp, do, lse, delta, mp, **kw)
    sq, d, skv = qshape[2], qshape[3], kshape[2]
    # The mask gets no gradient (None = zero cotangent).
    return dq[:, :, :sq, :d], dk[:, :, :skv, :d], dv[:, :, :skv, :d], None


_attention.defvjp(_attention_fwd, _attention_bwd)


def _opts(q, k, v, mask, causal, scale, dropout_p, block, interpret):
    reason = supports(q.shape, q.dtype, k.shape, k.dtype, v.shape, v.dtype,
                      None if mask is None else mask.shape,
                      None if mask is None else mask.dtype,
                      causal=causal, dropout_p=dropout_p)
    if reason:
        raise ValueError(f"pallas flash_attention: {reason}")
    d = q.shape[3]
    target = tpu_info.target(interpret)
    msz = 0 if mask is None else (1 if mask.dtype == jnp.bool_ else mask.dtype.itemsize)
    blocks = tuple(block) if block else choose_blocks(q.shape[2], k.shape[2], d, q.dtype,
                                                       target.chip, mask_itemsize=msz)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return bool(causal), scale, blocks, target


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None = None,
                    *, causal: bool = False, scale: float | None = None,
                    dropout_p: float = 0.0, block: Blocks | None = None,
                    interpret: bool | None = None) -> jax.Array:
    """softmax(q k^T * scale + mask) v, torch SDPA semantics; differentiable in q, k, v.

    q [b, hq, sq, d]; k, v [b, hkv, skv, d] with hq % hkv == 0 (GQA); mask broadcastable
    to [b, hq, sq, skv], bool (True = keep) or additive float; causal is top-left
    aligned; scale defaults to 1/sqrt(d). ``block`` = (bq, bk), multiples of 128.
    """
    opts = _opts(q, k, v, mask, causal, scale, dropout_p, block, interpret)
    return _attention(q, k, v, mask, opts)


def flash_attention_fwd(q: jax.Array, k: jax.Array, v: jax.Array,
                        mask: jax.Array | None = None, *, causal: bool = False,
                        scale: float | None = None, dropout_p: float = 0.0,
                        block: Blocks | None = None,
                        interpret: bool | None = None) -> tuple[jax.Array, jax.Array]:
    """Forward only: (out [b, hq, sq, d], logsumexp [b, hq, sq] f32; -inf on rows with
    no kept key), for ops that return the logsumexp. Not differentiable."""
    opts = _opts(q, k, v, mask, causal, scale, dropout_p, block, interpret)
    o, lse, _, _ = _forward(q, k, v, mask, opts)
    sq, d = q.shape[2], q.shape[3]
    return o[:, :, :sq, :d], lse[:, :, :sq, 0]


def flash_attention_bwd(do: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array,
                        out: jax.Array, lse: jax.Array, mask: jax.Array | None = None, *,
                        causal: bool = False, scale: float | None = None,
                        block: Blocks | None = None, interpret: bool | None = None,
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Backward from the saved forward (``out``, ``lse [b, hq, sq]``) -> (dq, dk, dv), for
    ops that keep the logsumexp between passes (aten's flash attention backward)."""
    opts = _opts(q, k, v, mask, causal, scale, 0.0, block, interpret)
    b, hq, sq, d = q.shape
    bq, bk = opts[2]
    sqp, skvp, dp = round_up(sq, bq), round_up(k.shape[2], bk), round_up(d, LANES)
    qp = pad_to(q, (b, hq, sqp, dp))
    kp, vp = (pad_to(x, x.shape[:2] + (skvp, dp)) for x in (k, v))
    mp = _prep_mask(mask, b, hq, sq, k.shape[2], sqp, skvp)
    op = pad_to(out.astype(q.dtype), qp.shape)
    # padded rows get lse 0: their scores are 0 and their output grads 0, so they add nothing
    lsep = jnp.broadcast_to(pad_to(lse.astype(jnp.float32)[..., None], (b, hq, sqp, 1)),
                            (b, hq, sqp, LANES))
    dq, dk, dv, _ = _attention_bwd(opts, ((qp, kp, vp, mp), op, lsep, q.shape, k.shape), do)
    return dq, dk, dv
