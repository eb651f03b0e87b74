"""FlexAttention (score_mod + block-sparse mask) forward and backward as Pallas TPU kernels.

Per (batch b, q head h, q tile i), walking the tile row's table of non-empty kv tiles
(scalar-prefetched: steps past the row's count fetch nothing new and compute nothing):

    s0  = (Q_i K_j^T) * scale;  ids = (b, h, q_idx, kv_idx) tiles built from iota
    s   = score_mod(s0, *ids, *captured blocks)          (per entry, vmapped over the tile)
    keep = mask_mod(*ids, *captured) & kv_idx < skv      (partial tiles only; full: all)
    online softmax: m' = max(m, rowmax s); p = exp(s - m') on kept; l, acc rescaled
    O_i = acc / l;  LSE_i = m + log l;  MAX_i = m            (no kept entry: 0, -inf, -inf)

Backward, with delta = rowsum(dO O) - dLSE and p = exp(s - LSE) recomputed per tile:

    dS = p (dO_i V_j^T - delta);  (dS0, dC) = vjp of score_mod at (s0, C) applied to dS
    dQ_i += scale dS0 K_j   (dq pass: same row tables; also the captured tensors' grads dC)
    dV_j += p^T dO_i;  dK_j += scale dS0^T Q_i   (dk/dv pass: column tables, walking
                                                  (q head of the kv group, q tile))

Captured tensors (learned biases, slopes, document ids) are read as blocks: each read
``buf[b|h|q_idx|kv_idx, ...]`` arrives as an array [Ab, Ah, Aq, Ak] whose dims are 1 or
the full extent, fetched per step as a (1|bq, 1|bk) block and broadcast over the tile.
Head dims pad to 128 lanes and sequences to the tiles (the kv tail is masked).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.flex_blocks import Tables, Tiling, tile_size

LANES = 128
NEG = -1e30
MAX_HEAD_DIM = 512
_NT = (((1,), (1,)), ((), ()))        # a @ b^T
_TN = (((0,), (0,)), ((), ()))        # a^T @ b
_SUPPORTED = ("float32", "bfloat16")
_TARGET = {128: (256, 512), 256: (512, 512)}     # tile targets by MXU width
_BIG_BLOCK = 1 << 20                  # mask blocks this large mean "no block mask"
SMEM_TABLE_BUDGET = 512 * 1024        # bytes of scalar-prefetched tables (SMEM is ~1 MiB)


@dataclasses.dataclass(frozen=True)
class Read:
    """How a captured tensor arrives: which of b, h, q, kv its [Ab, Ah, Aq, Ak] dims follow."""
    by_b: bool
    by_h: bool
    rows: bool
    cols: bool


@dataclasses.dataclass(frozen=True)
class Mods:
    """Per-entry functions (scalars in, scalar out; vmapped over tiles here) and reads.

    ``score(s, b, h, q, kv, *values)`` and ``mask(b, h, q, kv, *values)``; None means
    identity / keep all. ``grads[n]``: score read n needs its gradient."""
    score: Callable | None = None
    mask: Callable | None = None
    score_reads: tuple[Read, ...] = ()
    mask_reads: tuple[Read, ...] = ()
    grads: tuple[bool, ...] = ()


@dataclasses.dataclass(frozen=True)
class Config:
    """Static facts of one call."""
    scale: float
    tiling: Tiling
    sq: int
    skv: int
    rep: int              # q heads per kv head
    interpret: bool


# --- tiles, VMEM, limits -------------------------------------------------------------------

def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def vmem_bytes(bq: int, bk: int, dqk: int, dv: int, dtype, n_reads: int) -> int:
    """Largest VMEM footprint of the three kernels: double-buffered blocks, f32 scratch
    and about eight f32 (bq, bk) temporaries (scores, probabilities, their vjp)."""
    isz = jnp.dtype(dtype).itemsize
    dqk, dv = _round_up(dqk, LANES), _round_up(dv, LANES)
    stat = bq * LANES * 4
    reads = 2 * n_reads * bq * bk * 4
    tmp = 8 * bq * bk * 4
    # q, k, v, o blocks; lse and max outputs; m, l and acc scratch
    fwd = 2 * (bq * dqk + bk * dqk + bk * dv + bq * dv) * isz + 6 * stat + bq * dv * 4
    dq = 2 * (2 * bq * dqk + bk * dqk + bk * dv + bq * dv) * isz + 4 * stat + bq * dqk * 4
    dkv = 2 * (bq * dqk + bq * dv + 2 * bk * dqk + 2 * bk * dv) * isz + 4 * stat + bk * (dqk + dv) * 4
    return max(fwd, dq, dkv) + reads + tmp


def plan(sq: int, skv: int, dqk: int, dv: int, dtype, mask_block: tuple[int, int],
         mask_dims: tuple[int, int], n_reads: int = 0,
         chip: tpu_info.Chip | None = None) -> Tiling:
    """Kernel tiles: the mask's blocks where they are TPU-sized (tables stay exact),
    else multiples or divisors of them, halved until the kernels fit the chip's VMEM."""
    chip = chip or tpu_info.target().chip
    tq, tk = _TARGET[128 if chip.mxu <= 128 else 256]
    qunit = tpu_info.sublane(dtype)
    while True:
        bq = tile_size(mask_block[0], sq, qunit, tq)
        bk = tile_size(mask_block[1], skv, LANES, tk)
        fits = vmem_bytes(bq, bk, dqk, dv, dtype, n_reads) <= tpu_info.vmem_budget(chip)
        if fits or (tq <= qunit and tk <= LANES) or not _shrinkable(mask_block):
            break
        tq, tk = (tq, tk // 2) if tk >= tq and tk > LANES else (max(tq // 2, qunit), tk)
    sqp, skvp = _round_up(sq, bq), _round_up(skv, bk)
    return Tiling(bq, bk, sqp // bq, skvp // bk, *mask_dims)


def _shrinkable(mask_block) -> bool:
    return min(mask_block) >= _BIG_BLOCK


def supports(q_shape, k_shape, v_shape, dtype, tiling: Tiling, n_reads: int = 0,
             chip: tpu_info.Chip | None = None) -> str | None:
    """None when the kernels take these arguments, else the reason they do not."""
    chip = chip or tpu_info.target().chip
    if jnp.dtype(dtype).name not in _SUPPORTED:
        return f"{jnp.dtype(dtype).name} not supported (float32, bfloat16)"
    if not len(q_shape) == len(k_shape) == len(v_shape) == 4:
        return "query, key, value must be 4-D [batch, heads, seq, head_dim]"
    (b, hq, sq, dqk), (bk_, hkv, skv, dk), vs = q_shape, k_shape, v_shape
    if bk_ != b or vs[0] != b:
        return f"key/value batch {bk_} differs from query batch {b} (broadcast runs on XLA)"
    if dk != dqk or vs[1] != hkv or vs[2] != skv:
        return "query, key, value shapes disagree"
    if hkv == 0 or hq % hkv:
        return "query heads not a multiple of kv heads"
    if 0 in (b, hq, sq, skv, dqk, vs[3]):
        return "empty input"
    if max(dqk, vs[3]) > MAX_HEAD_DIM:
        return f"head_dim > {MAX_HEAD_DIM}"
    if tiling.bk % LANES or tiling.bq % tpu_info.sublane(dtype):
        return f"tiles {tiling.bq}x{tiling.bk} not TPU-aligned"
    smem = tiling.table_bytes
    if smem > SMEM_TABLE_BUDGET:
        return (f"block tables of {smem // 1024} KiB exceed the {SMEM_TABLE_BUDGET // 1024} KiB "
                f"SMEM budget (a per-batch/head block mask over long sequences)")
    need = vmem_bytes(tiling.bq, tiling.bk, dqk, vs[3], dtype, n_reads)
    if need > tpu_info.vmem_budget(chip):
        return f"tiles {tiling.bq}x{tiling.bk} need {need >> 20} MiB VMEM on {chip.name}"
    return None



# --- kernel bodies ---------------------------------------------------------------------------

def _per_entry(fn: Callable, *tiles):
    return jax.vmap(jax.vmap(fn))(*tiles)


def _ids(b, h, i, j, shape):
    """(b, h, q_idx, kv_idx) tiles of the entries of tile (i, j)."""
    bq, bk = shape
    return (jnp.full(shape, b, jnp.int32), jnp.full(shape, h, jnp.int32),
            i * bq + jax.lax.broadcasted_iota(jnp.int32, shape, 0),
            j * bk + jax.lax.broadcasted_iota(jnp.int32, shape, 1))


def _tiles(refs, shape):
    return [jnp.broadcast_to(r[...], shape) for r in refs]


def _scores(q, k, scale):
    return _dot(q, k, _NT) * jnp.float32(scale)


def _dot(a, b, dims=None):
    """a @ b (or the given contraction) on the MXU, f32 accumulation; f32 operands exact."""
    return jax.lax.dot_general(a.astype(b.dtype), b, dims or (((1,), (0,)), ((), ())),
                               precision=tpu_info.mxu_precision(b.dtype), preferred_element_type=jnp.float32)


def _keep(mods: Mods, ids, mask_refs, *, partial: bool, cfg: Config):
    """Kept entries of a tile (None: all): mask_mod on partial tiles, the kv tail bound."""
    keep = None
    if partial and mods.mask is not None:
        keep = _per_entry(mods.mask, *ids, *_tiles(mask_refs, ids[0].shape))
    if partial and cfg.skv % cfg.tiling.bk:
        inside = ids[3] < cfg.skv
        keep = inside if keep is None else keep & inside
    return keep


def _modded(mods: Mods, s0, ids, score_refs, grad_reads=()):
    """score_mod on the tile, and the vjp to (s0, the reads in ``grad_reads``)."""
    shape = s0.shape
    if mods.score is None:
        return s0, lambda ds: (ds,)
    fixed = [r[...] for r in score_refs]

    def f(s, *gvals):
        vals = list(fixed)
        for n, g in zip(grad_reads, gvals):
            vals[n] = g
        return _per_entry(mods.score, s, *ids, *[jnp.broadcast_to(v, shape) for v in vals])
    s, vjp = jax.vjp(f, s0, *[fixed[n] for n in grad_reads])
    return s, vjp


def _walk(cnt, ent, row, width, t):
    """Entry ``t`` of a tile list (clamped to the last listed one), and whether t is listed."""
    n = cnt[row]
    e = ent[row * width + jnp.maximum(jnp.minimum(t, n - 1), 0)]
    return jax.lax.shift_right_logical(e, jnp.int32(1)), (e & 1) == 1, t < n


def _branches(step, active, full, mods: Mods, cfg: Config):
    """Run ``step(partial)`` on listed tiles; full tiles skip mask_mod and bounds."""
    if mods.mask is None and cfg.skv % cfg.tiling.bk == 0:
        pl.when(active)(lambda: step(False))
        return
    pl.when(active & full)(lambda: step(False))
    pl.when(active & jnp.logical_not(full))(lambda: step(True))


def _fwd_kernel(cnt, ent, q_ref, k_ref, v_ref, *refs, cfg: Config, mods: Mods):
    ns, nm = len(mods.score_reads), len(mods.mask_reads)
    s_refs, m_refs = refs[:ns], refs[ns:ns + nm]
    o_ref, lse_ref, max_ref, m_sc, l_sc, acc_sc = refs[ns + nm:]
    b, h, i, t = (pl.program_id(a) for a in range(4))
    tl = cfg.tiling
    j, full, active = _walk(cnt, ent, _row(b, h, i, tl), tl.nk, t)

    @pl.when(t == 0)
    def _init():
        m_sc[...] = jnp.full_like(m_sc, NEG)
        l_sc[...] = jnp.zeros_like(l_sc)
        acc_sc[...] = jnp.zeros_like(acc_sc)

    def step(partial):
        ids = _ids(b, h, i, j, (tl.bq, tl.bk))
        s, _ = _modded(mods, _scores(q_ref[...], k_ref[...], cfg.scale), ids, s_refs)
        keep = _keep(mods, ids, m_refs, partial=partial, cfg=cfg)
        if keep is not None:
            s = jnp.where(keep, s, NEG)
        m_prev = m_sc[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - m_new[:, :1])
        if keep is not None:
            p = jnp.where(keep, p, 0.0)
        alpha = jnp.exp(m_prev - m_new)
        l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=1, keepdims=True)
        m_sc[...] = m_new
        acc_sc[...] = alpha[:, :1] * acc_sc[...] + _dot(p, v_ref[...])

    _branches(step, active, full, mods, cfg)

    @pl.when(t == pl.num_programs(3) - 1)
    def _finish():
        l, m = l_sc[...], m_sc[...]
        o_ref[...] = (acc_sc[...] / jnp.where(l == 0, 1.0, l)[:, :1]).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)
        max_ref[...] = jnp.where(m > NEG, m, -jnp.inf)


def _bwd_tile(mods, cfg, ids, q, k, v, do, lse, delta, s_refs, m_refs, partial, grad_reads=()):
    """p, dS0 (gradient at the unmodified scores) and the reads' gradients of one tile."""
    s, vjp = _modded(mods, _scores(q, k, cfg.scale), ids, s_refs, grad_reads)
    keep = _keep(mods, ids, m_refs, partial=partial, cfg=cfg)
    p = jnp.exp(s - lse[:, :1])
    if keep is not None:
        p = jnp.where(keep, p, 0.0)
    dp = _dot(do, v, _NT)
    ds0, *dreads = vjp(p * (dp - delta[:, :1]))
    if keep is not None:
        ds0 = jnp.where(keep, ds0, 0.0)
    return p, ds0, dreads


def _dq_kernel(cnt, ent, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: Config,
               mods: Mods, grad_reads: tuple[int, ...], tile_grads: tuple[bool, ...]):
    ns, nm, ng = len(mods.score_reads), len(mods.mask_reads), len(grad_reads)
    s_refs, m_refs = refs[:ns], refs[ns:ns + nm]
    refs = refs[ns + nm + sum(tile_grads):]      # past the zeros aliased to tile gradients
    dq_ref, g_refs = refs[0], refs[1:1 + ng]
    acc_sc, *g_scs = refs[1 + ng:]
    b, h, i, t = (pl.program_id(a) for a in range(4))
    tl = cfg.tiling
    j, full, active = _walk(cnt, ent, _row(b, h, i, tl), tl.nk, t)

    @pl.when(t == 0)
    def _init():
        acc_sc[...] = jnp.zeros_like(acc_sc)
        for sc in g_scs:
            sc[...] = jnp.zeros_like(sc)

    def step(partial):
        ids = _ids(b, h, i, j, (tl.bq, tl.bk))
        _, ds0, dreads = _bwd_tile(mods, cfg, ids, q_ref[...], k_ref[...], v_ref[...], do_ref[...],
                                   lse_ref[...], delta_ref[...], s_refs, m_refs, partial, grad_reads)
        acc_sc[...] += _dot(ds0, k_ref[...])
        rows = iter(g_scs)
        for g_ref, tile, d in zip(g_refs, tile_grads, dreads):
            if tile:
                g_ref[...] = d
            else:
                sc = next(rows)
                sc[...] += jnp.sum(d, axis=1, keepdims=True)

    _branches(step, active, full, mods, cfg)

    @pl.when(t == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (acc_sc[...] * jnp.float32(cfg.scale)).astype(dq_ref.dtype)
        rows = iter(g_scs)
        for g_ref, tile in zip(g_refs, tile_grads):
            if not tile:
                g_ref[...] = next(rows)[...]


def _dkv_kernel(cnt, ent, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: Config,
                mods: Mods):
    ns, nm = len(mods.score_reads), len(mods.mask_reads)
    s_refs, m_refs = refs[:ns], refs[ns:ns + nm]
    dk_ref, dv_ref, dk_sc, dv_sc = refs[ns + nm:]
    b, g, j, t = (pl.program_id(a) for a in range(4))
    tl = cfg.tiling
    h = g * cfg.rep + _div(t, tl.nq)
    i, full, active = _walk(cnt, ent, _col(b, h, j, tl), tl.nq, _rem(t, tl.nq))

    @pl.when(t == 0)
    def _init():
        dk_sc[...] = jnp.zeros_like(dk_sc)
        dv_sc[...] = jnp.zeros_like(dv_sc)

    def step(partial):
        ids = _ids(b, h, i, j, (tl.bq, tl.bk))
        q, do = q_ref[...], do_ref[...]
        p, ds0, _ = _bwd_tile(mods, cfg, ids, q, k_ref[...], v_ref[...], do, lse_ref[...],
                              delta_ref[...], s_refs, m_refs, partial)
        dv_sc[...] += _dot(p, do, _TN)
        dk_sc[...] += _dot(ds0, q, _TN)

    _branches(step, active, full, mods, cfg)

    @pl.when(t == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = (dk_sc[...] * jnp.float32(cfg.scale)).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


# --- index maps, BlockSpecs, pallas_calls ------------------------------------------------------

def _div(a, b: int):
    return jax.lax.div(a, jnp.asarray(b, jnp.int32))


def _rem(a, b: int):
    return jax.lax.rem(a, jnp.asarray(b, jnp.int32))


def _mask_row(b, h, tl: Tiling):
    return (b if tl.mb > 1 else 0) * tl.mh + (h if tl.mh > 1 else 0)


def _row(b, h, i, tl: Tiling):
    return _mask_row(b, h, tl) * tl.nq + i


def _col(b, h, j, tl: Tiling):
    return _mask_row(b, h, tl) * tl.nk + j


def _read_spec(read: Read, tl: Tiling, where):
    """BlockSpec of a captured read; ``where(grid..., refs) -> (b, h, i, j)`` of the step."""
    def index(*args):
        b, h, i, j = where(*args)
        return (b if read.by_b else 0, h if read.by_h else 0, i if read.rows else 0,
                j if read.cols else 0)
    return pl.BlockSpec((None, None, tl.bq if read.rows else 1, tl.bk if read.cols else 1), index)


def _row_where(cfg: Config):
    """(b, h, i, j) of a step of the row-walking grid (b, h, i, t)."""
    tl = cfg.tiling

    def where(b, h, i, t, cnt, ent):
        return b, h, i, _walk(cnt, ent, _row(b, h, i, tl), tl.nk, t)[0]
    return where


def _col_where(cfg: Config):
    """(b, h, i, j) of a step of the column-walking grid (b, kv head g, j, t)."""
    tl = cfg.tiling

    def where(b, g, j, t, cnt, ent):
        h = g * cfg.rep + _div(t, tl.nq)
        return b, h, _walk(cnt, ent, _col(b, h, j, tl), tl.nq, _rem(t, tl.nq))[0], j
    return where


def _params():
    return pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))


def _cost(cfg: Config, q, k, v, passes: int, density: float) -> pl.CostEstimate:
    b, hq, sqp, dqk = q.shape
    skvp, dv = k.shape[2], v.shape[3]
    entries = b * hq * sqp * skvp * density
    flops = 2 * entries * (dqk + dv) * passes
    kv_reads = cfg.tiling.nq * density * (k.size * k.dtype.itemsize + v.size * v.dtype.itemsize)
    return pl.CostEstimate(flops=int(flops), transcendentals=int(entries * passes),
                           bytes_accessed=int(2 * q.size * q.dtype.itemsize + kv_reads))


def _row_specs(cfg: Config, q, k, v, mods: Mods):
    """q, k, v, stat and captured-read BlockSpecs of the row-walking kernels."""
    tl = cfg.tiling
    where = _row_where(cfg)
    qspec = pl.BlockSpec((None, None, tl.bq, q.shape[3]), lambda b, h, i, t, c, e: (b, h, i, 0))
    def kv(d):
        return pl.BlockSpec((None, None, tl.bk, d), lambda b, h, i, t, c, e: (
            b, _div(h, cfg.rep), where(b, h, i, t, c, e)[3], 0))
    stat = pl.BlockSpec((None, None, tl.bq, LANES), lambda b, h, i, t, c, e: (b, h, i, 0))
    reads = [_read_spec(r, tl, where) for r in mods.score_reads + mods.mask_reads]
    return qspec, kv(k.shape[3]), kv(v.shape[3]), stat, reads


def mods_reason(mods: Mods) -> str | None:
    """None when the kernels can compute these mods' gradients, else why not."""
    for n, r in enumerate(mods.score_reads):
        if mods.grads[n] and r.cols and not r.rows:
            return ("the gradient of a captured tensor read by kv_idx but not q_idx (it would "
                    "sum over q tiles in the dq pass)")
    return None


def _fwd_call(q, k, v, tables: Tables, reads, *, cfg: Config, mods: Mods, density: float):
    b, hq, sqp, _ = q.shape
    tl = cfg.tiling
    qspec, kspec, vspec, stat, rspecs = _row_specs(cfg, q, k, v, mods)
    ospec = pl.BlockSpec((None, None, tl.bq, v.shape[3]), lambda b_, h, i, t, c, e: (b_, h, i, 0))
    kernel = functools.partial(_fwd_kernel, cfg=cfg, mods=mods)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(b, hq, tl.nq, tl.nk),
            in_specs=[qspec, kspec, vspec, *rspecs],
            out_specs=[ospec, stat, stat],
            scratch_shapes=[pltpu.VMEM((tl.bq, LANES), jnp.float32),
                            pltpu.VMEM((tl.bq, LANES), jnp.float32),
                            pltpu.VMEM((tl.bq, v.shape[3]), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct((b, hq, sqp, v.shape[3]), q.dtype),
                   jax.ShapeDtypeStruct((b, hq, sqp, LANES), jnp.float32),
                   jax.ShapeDtypeStruct((b, hq, sqp, LANES), jnp.float32)],
        compiler_params=_params(),
        cost_estimate=_cost(cfg, q, k, v, 1, density),
        interpret=cfg.interpret,
    )(tables.row_count, tables.row_entry, q, k, v, *reads)


def _dq_call(q, k, v, do, lse, delta, tables: Tables, reads, *, cfg: Config, mods: Mods,
             density: float):
    b, hq, sqp, _ = q.shape
    tl = cfg.tiling
    qspec, kspec, vspec, stat, rspecs = _row_specs(cfg, q, k, v, mods)
    dospec = pl.BlockSpec((None, None, tl.bq, v.shape[3]), lambda b_, h, i, t, c, e: (b_, h, i, 0))
    grad_reads = tuple(n for n, g in enumerate(mods.grads) if g)
    tile_grads = tuple(mods.score_reads[n].cols for n in grad_reads)
    where = _row_where(cfg)
    gspecs, gshapes, scratch, aliases, zeros = [], [], [], {}, []
    n_in = 2 + 6 + len(rspecs)
    for n, tile in zip(grad_reads, tile_grads):
        r = tl.bq if mods.score_reads[n].rows else 1
        if tile:        # one (bq, bk) block per listed tile; unlisted tiles stay zero
            gspecs.append(pl.BlockSpec((None, None, tl.bq, tl.bk), where))
            gshapes.append(jax.ShapeDtypeStruct((b, hq, sqp, tl.nk * tl.bk), jnp.float32))
            aliases[n_in + len(zeros)] = 1 + len(gshapes) - 1
            zeros.append(jnp.zeros(gshapes[-1].shape, jnp.float32))
        else:           # summed over the row's kv tiles in scratch
            gspecs.append(pl.BlockSpec((None, None, None, r, 1),
                                       lambda b_, h, i, t, c, e: (b_, h, i, 0, 0)))
            gshapes.append(jax.ShapeDtypeStruct((b, hq, tl.nq, r, 1), jnp.float32))
            scratch.append(pltpu.VMEM((r, 1), jnp.float32))
    kernel = functools.partial(_dq_kernel, cfg=cfg, mods=mods, grad_reads=grad_reads,
                               tile_grads=tile_grads)
    zspecs = [pl.BlockSpec(memory_space=pl.ANY)] * len(zeros)
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(b, hq, tl.nq, tl.nk),
            in_specs=[qspec, kspec, vspec, dospec, stat, stat, *rspecs, *zspecs],
            out_specs=[qspec, *gspecs],
            scratch_shapes=[pltpu.VMEM((tl.bq, q.shape[3]), jnp.float32), *scratch]),
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), *gshapes],
        input_output_aliases=aliases,
        compiler_params=_params(),
        cost_estimate=_cost(cfg, q, k, v, 2, density),
        interpret=cfg.interpret,
    )(tables.row_count, tables.row_entry, q, k, v, do, lse, delta, *reads, *zeros)
    return out[0], out[1:]


def _dkv_call(q, k, v, do, lse, delta, tables: Tables, reads, *, cfg: Config, mods: Mods,
              density: float):
    b, hkv = k.shape[:2]
    tl = cfg.tiling
    where = _col_where(cfg)

    def qside(d):
        def index(*a):
            b_, h, i, _ = where(*a)
            return b_, h, i, 0
        return pl.BlockSpec((None, None, tl.bq, d), index)
    stat = qside(LANES)

    def kv(d):
        return pl.BlockSpec((None, None, tl.bk, d), lambda b_, g, j, t, c, e: (b_, g, j, 0))
    rspecs = [_read_spec(r, tl, where) for r in mods.score_reads + mods.mask_reads]
    kernel = functools.partial(_dkv_kernel, cfg=cfg, mods=mods)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(b, hkv, tl.nk, cfg.rep * tl.nq),
            in_specs=[qside(q.shape[3]), kv(k.shape[3]), kv(v.shape[3]), qside(v.shape[3]),
                      stat, stat, *rspecs],
            out_specs=[kv(k.shape[3]), kv(v.shape[3])],
            scratch_shapes=[pltpu.VMEM((tl.bk, k.shape[3]), jnp.float32),
                            pltpu.VMEM((tl.bk, v.shape[3]), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=_params(),
        cost_estimate=_cost(cfg, q, k, v, 2, density),
        interpret=cfg.interpret,
    )(tables.col_count, tables.col_entry, q, k, v, do, lse, delta, *reads)


# --- wrapper: padding, forward and backward entry points ------------------------------------------

def _pad(x, shape):
    if x.shape == tuple(shape):
        return x
    return jnp.pad(x, [(0, t - s) for s, t in zip(x.shape, shape)])


def _pad_reads(reads, specs: tuple[Read, ...], cfg: Config):
    """Captured reads [Ab, Ah, Aq, Ak] -> 32-bit, q/kv dims padded to the tiles."""
    tl = cfg.tiling
    out = []
    for a, r in zip(reads, specs):
        dt = jnp.float32 if jnp.issubdtype(a.dtype, jnp.floating) else jnp.int32
        a = a.astype(dt)
        out.append(_pad(a, a.shape[:2] + (tl.nq * tl.bq if r.rows else 1,
                                          tl.nk * tl.bk if r.cols else 1)))
    return out


def _operands(q, k, v, cfg: Config):
    tl = cfg.tiling
    sqp, skvp = tl.nq * tl.bq, tl.nk * tl.bk
    dqk, dv = _round_up(q.shape[3], LANES), _round_up(v.shape[3], LANES)
    return (_pad(q, q.shape[:2] + (sqp, dqk)), _pad(k, k.shape[:2] + (skvp, dqk)),
            _pad(v, v.shape[:2] + (skvp, dv)))


def _config(q, k, scale, tiling, interpret) -> Config:
    return Config(float(scale), tiling, q.shape[2], k.shape[2], q.shape[1] // k.shape[1],
                  tpu_info.target(interpret).interpret)


def flex_attention_fwd(q, k, v, tables: Tables, mods: Mods, score_reads=(), mask_reads=(), *,
                       scale: float | None = None, tiling: Tiling, interpret: bool | None = None,
                       density: float = 1.0) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(out [b, hq, sq, dv], logsumexp [b, hq, sq] f32, max score [b, hq, sq] f32).

    q [b, hq, sq, d]; k [b, hkv, skv, d]; v [b, hkv, skv, dv]; ``tables`` from
    ``flex_blocks.tables`` for ``tiling``; captured reads as [Ab, Ah, Aq, Ak] arrays in
    the order of ``mods.score_reads + mods.mask_reads``. ``density`` (fraction of tiles
    listed) only scales the cost estimate. Rows with no kept entry: out 0, lse/max -inf.
    """
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    cfg = _config(q, k, scale, tiling, interpret)
    with jax.enable_x64(False):
        qp, kp, vp = _operands(q, k, v, cfg)
        reads = _pad_reads(score_reads, mods.score_reads, cfg) + \
            _pad_reads(mask_reads, mods.mask_reads, cfg)
        o, lse, mx = _fwd_call(qp, kp, vp, tables, reads, cfg=cfg, mods=mods, density=density)
    sq, dv = q.shape[2], v.shape[3]
    return o[:, :, :sq, :dv], lse[:, :, :sq, 0], mx[:, :, :sq, 0]


def flex_attention_bwd(do, dlse, q, k, v, out, lse, tables: Tables, mods: Mods, score_reads=(),
                       mask_reads=(), *, scale: float | None = None, tiling: Tiling,
                       interpret: bool | None = None, density: float = 1.0):
    """(dq, dk, dv, grads of the score reads with ``mods.grads`` set, [Ab, Ah, Aq, Ak]
    each) from the saved forward (``out``, natural-log ``lse``); ``dlse`` may be None."""
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    cfg = _config(q, k, scale, tiling, interpret)
    with jax.enable_x64(False):
        qp, kp, vp = _operands(q, k, v, cfg)
        sqp = qp.shape[2]
        dop = _pad(do.astype(q.dtype), qp.shape[:3] + (vp.shape[3],))
        delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
        if dlse is not None:
            delta = delta - dlse.astype(jnp.float32)
        # rows with no kept entry (and padded rows) get p = exp(s - inf) = 0
        lse_b = jnp.where(jnp.isneginf(lse), jnp.inf, lse.astype(jnp.float32))
        stat = functools.partial(_lanes, shape=qp.shape[:3])
        lse_p, delta_p = stat(lse_b, fill=jnp.inf), stat(delta, fill=0.0)
        reads = _pad_reads(score_reads, mods.score_reads, cfg) + \
            _pad_reads(mask_reads, mods.mask_reads, cfg)
        kw = dict(cfg=cfg, mods=mods, density=density)
        dq, greads = _dq_call(qp, kp, vp, dop, lse_p, delta_p, tables, reads, **kw)
        dk, dv = _dkv_call(qp, kp, vp, dop, lse_p, delta_p, tables, reads, **kw)
    sq, skv, d, dvd = q.shape[2], k.shape[2], q.shape[3], v.shape[3]
    grads = _read_grads(greads, mods, score_reads, cfg, sqp)
    return dq[:, :, :sq, :d], dk[:, :, :skv, :d], dv[:, :, :skv, :dvd], grads


def _lanes(x, *, shape, fill):
    """[b, h, sq] -> [b, h, sqp, 128] lane-replicated, padded rows = ``fill``."""
    x = jnp.pad(x, [(0, 0), (0, 0), (0, shape[2] - x.shape[2])], constant_values=fill)
    return jnp.broadcast_to(x[..., None], x.shape + (LANES,))


def _read_grads(greads, mods: Mods, score_reads, cfg: Config, sqp: int):
    """Per-(b, h) gradient blocks -> each read's [Ab, Ah, Aq, Ak] gradient."""
    out = []
    it = iter(greads)
    for n, (a, r) in enumerate(zip(score_reads, mods.score_reads)):
        if not mods.grads[n]:
            out.append(None)
            continue
        g = next(it)
        b, hq = g.shape[:2]
        g = g if r.cols else g.reshape(b, hq, -1, 1)           # [b, hq, nq*r, 1]
        rows = cfg.sq if r.rows else 1
        g = g[:, :, :rows] if r.rows else jnp.sum(g, axis=2, keepdims=True)
        g = g[..., :cfg.skv] if r.cols else g
        g = g if r.by_b else jnp.sum(g, axis=0, keepdims=True)
        g = g if r.by_h else jnp.sum(g, axis=1, keepdims=True)
        out.append(g.astype(a.dtype))
    return tuple(out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _attention(q, k, v, score_reads, mask_reads, tables, mods, opts):
    return flex_attention_fwd(q, k, v, tables, mods, score_reads, mask_reads, **dict(opts))[0]


def _attention_fwd(q, k, v, score_reads, mask_reads, tables, mods, opts):
    out, lse, _ = flex_attention_fwd(q, k, v, tables, mods, score_reads, mask_reads, **dict(opts))
    return out, (q, k, v, score_reads, mask_reads, tables, out, lse)


def _attention_bwd(mods, opts, res, g):
    q, k, v, score_reads, mask_reads, tables, out, lse = res
    dq, dk, dv, dr = flex_attention_bwd(g, None, q, k, v, out, lse, tables, mods, score_reads,
                                        mask_reads, **dict(opts))
    dr = tuple(jnp.zeros_like(a) if d is None else d for a, d in zip(score_reads, dr))
    return dq, dk, dv, dr, tuple(None for _ in mask_reads), None


_attention.defvjp(_attention_fwd, _attention_bwd)


def flex_attention(q, k, v, tables: Tables, mods: Mods, score_reads=(), mask_reads=(), *,
                   scale: float | None = None, tiling: Tiling,
                   interpret: bool | None = None) -> jax.Array:
    """Differentiable in q, k, v and the score reads (those with ``mods.grads`` set)."""
    opts = (("scale", scale), ("tiling", tiling), ("interpret", interpret))
    return _attention(q, k, v, tuple(score_reads), tuple(mask_reads), tables, mods, opts)
