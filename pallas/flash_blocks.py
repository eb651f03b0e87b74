"""Blocks, block tables and masks for the flash attention kernels (``flash_attention.py``).

- Sequence blocks: multiples of 128 with the least modelled time on the chip (sequence
  padding, the diagonal blocks of causal masks and the per-step cost all count) among
  those whose three kernels fit the VMEM budget.
- Block tables: which kv blocks each q block needs, from the *structural* masks only
  (causal, sliding window, segment ids): per (batch, q block) the first and last needed kv
  block, and per (batch, kv block) the first and last needed q block. They are
  scalar-prefetched into SMEM; the kernels skip steps outside the range (no compute) and
  their index maps clamp to it (no new copy). Needed blocks form a contiguous range for
  causal and windowed masks and for sorted segment ids (packed sequences); for unsorted
  ids the range covers every needed block and the element mask does the rest.
- Dense masks: bool masks travel as int8 (1 = keep), additive masks in their own dtype.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from tpu_kernels.pallas import tpu_info, tuned
from tpu_kernels.pallas.launch import pad_to
from tpu_kernels.pallas.tpu_info import round_up

Blocks = tuple[int, int]   # (bq, bk)
LANES = 128
SUBLANES = 8
_MAX_BLOCK = 2048          # search bound for either block
_PAD_SLACK = 1 / 16        # padding a block may add beyond what 128-blocks need
# kernel_model's figures: a grid step's fixed cost (JAX's Pallas TPU docs, ~0.35 us) and
# the bf16 passes an f32 product takes at Precision.HIGHEST.
_STEP_SECONDS = 0.35e-6
_F32_MXU_PASSES = 6


# --- block sizes and VMEM -------------------------------------------------------------

def vmem_bytes(blocks: Blocks, head_dim: int, dtype, mask_itemsize: int = 0,
               segments: bool = False) -> int:
    """Largest VMEM footprint of the three kernels (fwd, dq, dkv): double-buffered
    blocks + f32 scratch + the f32 (bq, bk) temporaries of the body. VMEM pads the head
    dim to 128 lanes even where HBM does not."""
    bq, bk = blocks
    d = round_up(head_dim, LANES)
    isz = jnp.dtype(dtype).itemsize
    stat = bq * LANES * 4                                  # one (bq, 128) f32 block
    mask = 2 * bq * bk * mask_itemsize
    seg = 2 * (max(bq, bk) * LANES + SUBLANES * max(bq, bk)) * 4 if segments else 0
    fwd = (2 * (2 * bq * d + 2 * bk * d) * isz + 2 * stat   # q, o, k, v; lse out
           + 2 * stat + bq * d * 4 + 2 * bq * bk * 4 + mask)   # m, l, acc; s, p
    dq = (2 * (3 * bq * d + 2 * bk * d) * isz + 2 * 2 * stat  # q, do, dq, k, v; lse, delta
          + bq * d * 4 + 4 * bq * bk * 4 + mask)              # acc; s, p, dp, ds
    dkv = (2 * (2 * bq * d + 4 * bk * d) * isz + 2 * 2 * stat  # q, do, k, v, dk, dv
           + 2 * bk * d * 4 + 4 * bq * bk * 4 + mask)
    return max(fwd, dq, dkv) + seg


def modelled_seconds(blocks: Blocks, sq: int, skv: int, head_dim: int, dtype,
                     chip: tpu_info.Chip, causal: bool = False) -> float:
    """Modelled time of forward + backward for one (batch, head) with ``blocks``: the
    padded flops (MXU passes) and HBM bytes the three grids move against the chip's
    roofline, plus a fixed cost per grid step (``registry/costs/kernel_model.py``'s accounting)."""
    lay = Layout(sq, skv, *blocks)
    frac = float(band(lay, causal, None).mean())
    isz = jnp.dtype(dtype).itemsize
    q, kv = lay.sqp * head_dim * isz, lay.skvp * head_dim * isz
    stats = 2 * lay.sqp * LANES * 4
    flops = 2 * 9 * lay.sqp * lay.skvp * head_dim * frac          # fwd 2, dq 3, dkv 4 products
    # a block dim that is not a multiple of the MXU width leaves part of a pass idle
    flops *= round_up(lay.bq, chip.mxu) / lay.bq * round_up(lay.bk, chip.mxu) / lay.bk
    moved = (2 * (3 * q + 2 * kv * lay.nq * frac + stats)            # fwd, dq
             + 4 * kv + (2 * q + stats) * lay.nk * frac)             # dkv
    peak = chip.bf16_flops / (_F32_MXU_PASSES if jnp.dtype(dtype) == jnp.float32 else 1)
    return max(flops / peak, moved / chip.hbm_bytes_per_s) + 3 * lay.nq * lay.nk * _STEP_SECONDS


def _seq_blocks(n: int) -> list[int]:
    """Multiples of 128 up to ``_MAX_BLOCK`` that pad ``n`` at most ``_PAD_SLACK`` more
    than 128-blocks do (seq 520: 128 and 640, never 512, which pads to 1024)."""
    least = round_up(n, LANES)
    return [b for b in range(LANES, min(least, _MAX_BLOCK) + 1, LANES)
            if round_up(n, b) <= least * (1 + _PAD_SLACK)]


def choose_blocks(sq: int, skv: int, head_dim: int, dtype, chip: tpu_info.Chip,
                  mask_itemsize: int = 0, segments: bool = False, causal: bool = False) -> Blocks:
    """The tuned table's entry (``tuned``; calls without a mask or segment ids), else
    (bq, bk), multiples of 128, with the least modelled time (``modelled_seconds``:
    sequence padding, diagonal blocks and per-step cost all count) among those that pad
    little (``_seq_blocks``) and whose kernels fit the chip's VMEM budget; (128, 128)
    when none does."""
    hit = None if (mask_itemsize or segments) else tuned.lookup_blocks(
        "flash_attention", chip, dtype, align=(LANES, LANES), sq=sq, skv=skv, d=head_dim)
    if hit and vmem_bytes(hit, head_dim, dtype) <= tuned.vmem_budget(chip, hit):
        return hit
    budget = tpu_info.vmem_budget(chip)
    best, best_t = (LANES, LANES), float("inf")
    for bq in _seq_blocks(sq):
        for bk in _seq_blocks(skv):
            if vmem_bytes((bq, bk), head_dim, dtype, mask_itemsize, segments) > budget:
                continue
            t = modelled_seconds((bq, bk), sq, skv, head_dim, dtype, chip, causal)
            if t < best_t * (1 - 1e-9):
                best, best_t = (bq, bk), t
    return best


# --- block tables -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Layout:
    """Padded geometry: true lengths, blocks, block counts."""
    sq: int
    skv: int
    bq: int
    bk: int

    @property
    def nq(self) -> int:
        return -(-self.sq // self.bq)

    @property
    def nk(self) -> int:
        return -(-self.skv // self.bk)

    @property
    def sqp(self) -> int:
        return self.nq * self.bq

    @property
    def skvp(self) -> int:
        return self.nk * self.bk


@dataclasses.dataclass(frozen=True)
class Tables:
    """Needed block ranges, flat int32 (scalar-prefetched). ``rows`` has one entry per
    (batch or 1, q block), ``cols`` one per (batch or 1, kv block); an empty range has
    hi = lo - 1."""
    row_lo: jax.Array
    row_hi: jax.Array
    col_lo: jax.Array
    col_hi: jax.Array
    batched: bool         # tables per batch (segment ids) or shared (structure only)
    fraction: float       # share of blocks the structural band needs (cost estimates)


jax.tree_util.register_dataclass(Tables, data_fields=["row_lo", "row_hi", "col_lo", "col_hi"],
                                 meta_fields=["batched", "fraction"])


def band(lay: Layout, causal: bool, window: int | None, xp: Any = np) -> Any:
    """[nq, nk] bool: blocks with a kept entry under causal (top-left: col <= row) and
    the sliding window (row - col < window), rows and cols within the true lengths.
    ``xp=jnp`` builds it from iotas inside a trace: no array constant (which
    ``custom_partitioning``, spmd_kernels, refuses)."""
    i = xp.arange(lay.nq)[:, None]
    j = xp.arange(lay.nk)[None, :]
    r0, r1 = i * lay.bq, xp.minimum(i * lay.bq + lay.bq, lay.sq) - 1
    c0, c1 = j * lay.bk, xp.minimum(j * lay.bk + lay.bk, lay.skv) - 1
    need = xp.ones((lay.nq, lay.nk), bool)
    if causal:
        need &= c0 <= r1
    if window is not None:
        need &= r0 - c1 < window
    return need


def _block_ids(ids: jax.Array, n: int, block: int, nblocks: int):
    """Per block: (min, max) of the segment ids of its true positions."""
    padded = pad_to(ids, (ids.shape[0], nblocks * block), 0)
    valid = jnp.arange(nblocks * block) < n
    big = jnp.iinfo(jnp.int32).max
    lo = jnp.where(valid, padded, big).reshape(-1, nblocks, block).min(-1)
    hi = jnp.where(valid, padded, -big).reshape(-1, nblocks, block).max(-1)
    return lo, hi


def _ranges(need, axis: int):
    """First and last True along ``axis`` (hi = lo - 1 where none), int32, flattened."""
    n = need.shape[axis]
    any_ = need.any(axis)
    lo = jnp.argmax(need, axis)
    hi = n - 1 - jnp.argmax(jnp.flip(need, axis), axis)
    lo = jnp.where(any_, lo, 0).astype(jnp.int32)
    hi = jnp.where(any_, hi, -1).astype(jnp.int32)
    return lo.reshape(-1), hi.reshape(-1)


def tables(lay: Layout, causal: bool, window: int | None,
           q_ids: jax.Array | None = None, kv_ids: jax.Array | None = None) -> Tables:
    """Block tables from the structural masks; ``q_ids [b, sq]``, ``kv_ids [b, skv]``
    int32 segment ids (both or neither): q and kv blocks whose id ranges do not overlap
    are skipped."""
    fraction = float(band(lay, causal, window).mean())
    need = band(lay, causal, window, jnp)[None]
    if q_ids is not None:
        qlo, qhi = _block_ids(q_ids, lay.sq, lay.bq, lay.nq)
        klo, khi = _block_ids(kv_ids, lay.skv, lay.bk, lay.nk)
        need = need & (klo[:, None, :] <= qhi[:, :, None]) & (qlo[:, :, None] <= khi[:, None, :])
    row_lo, row_hi = _ranges(need, 2)
    col_lo, col_hi = _ranges(need, 1)
    return Tables(row_lo, row_hi, col_lo, col_hi, q_ids is not None, fraction)


def in_range(lo, hi, x):
    """``lo <= x <= hi`` (a step inside the needed range)."""
    return jnp.logical_and(lo <= x, x <= hi)


def clamp(x, lo, hi):
    """``x`` clamped into [lo, max(lo, hi)]: the block to fetch at a step, so steps
    outside the needed range repeat a fetched block instead of copying a new one."""
    return jnp.minimum(jnp.maximum(x, lo), jnp.maximum(lo, hi))


# --- index maps -----------------------------------------------------------------------

def div(a, b: int):
    """Truncating a / b for non-negative int32 grid indices (lax.div, not //: floor
    division lowers through sign, which Mosaic resolves against the local device; the
    constant is typed so it stays int32 under jax_enable_x64)."""
    return jax.lax.div(a, jnp.asarray(b, a.dtype))


def rem(a, b: int):
    return jax.lax.rem(a, jnp.asarray(b, a.dtype))


def row(b, i, n: int, batched: bool):
    """Flat block-table index of (batch b, block i): tables are per batch or shared."""
    return b * n + i if batched else i


def extra_specs(seg, mask, bq, bk, batch_of, head_of, rows_of, cols_of, transposed=False):
    """BlockSpecs of the segment ids (q ids as a column, kv ids as a row; ``transposed``:
    kv ids as a column, q ids as a row) and of a [1|b, 1|hq, sqp, skvp] mask (broadcast
    dims always read block 0); index maps take (grid indices, lo_ref, hi_ref)."""
    specs = []
    if seg is not None and not transposed:
        specs += [pl.BlockSpec((None, bq, LANES), lambda *a: (batch_of(*a), rows_of(*a), 0)),
                  pl.BlockSpec((None, SUBLANES, bk), lambda *a: (batch_of(*a), 0, cols_of(*a)))]
    elif seg is not None:
        specs += [pl.BlockSpec((None, bk, LANES), lambda *a: (batch_of(*a), cols_of(*a), 0)),
                  pl.BlockSpec((None, SUBLANES, bq), lambda *a: (batch_of(*a), 0, rows_of(*a)))]
    if mask is not None:
        mb, mh = mask.shape[:2]
        specs.append(pl.BlockSpec(
            (None, None, bq, bk),
            lambda *a: (batch_of(*a) if mb > 1 else 0, head_of(*a) if mh > 1 else 0,
                        rows_of(*a), cols_of(*a))))
    return specs


# --- operand preparation -------------------------------------------------------------

def prepare(q, k, v, mask, q_ids, kv_ids, lay: Layout, causal: bool, window: int | None):
    """Sequence-padded q, k, v; segment ids and mask as the kernels read them; tables."""
    qp = pad_to(q, q.shape[:2] + (lay.sqp, q.shape[3]))
    kp, vp = (pad_to(x, x.shape[:2] + (lay.skvp, x.shape[3])) for x in (k, v))
    seg = prep_segments(q_ids, kv_ids, lay)
    mp = prep_mask(mask, q.shape[0], q.shape[1], lay)
    tabs = tables(lay, causal, window, q_ids, kv_ids)
    return qp, kp, vp, seg, mp, tabs



def prep_mask(mask, b: int, hq: int, lay: Layout):
    """Mask -> [1|b, 1|hq, sqp, skvp]: bool becomes int8 (1 = keep, padding 0); float
    stays additive (padding 0: the kv tail is masked by index anyway)."""
    if mask is None:
        return None
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    mask = jnp.broadcast_to(mask, mask.shape[:2] + (lay.sq, lay.skv))
    if mask.dtype == jnp.bool_:
        mask = mask.astype(jnp.int8)
    return pad_to(mask, mask.shape[:2] + (lay.sqp, lay.skvp))


def columns(x):
    """[..., n] -> [..., n, 128]: lane-replicated, a (block, 128) column per block."""
    return jnp.broadcast_to(x[..., None], x.shape + (LANES,))


def rows(x):
    """[..., n] -> [..., 8, n]: sublane-replicated, an (8, block) row per block."""
    return jnp.broadcast_to(x[..., None, :], x.shape[:-1] + (SUBLANES, x.shape[-1]))


def prep_segments(q_ids, kv_ids, lay: Layout):
    """Segment ids as the kernels read them, int32: (q column, kv row) for the forward and
    dQ (scores (bq, bk)), (kv column, q row) for dK/dV (scores transposed)."""
    if q_ids is None:
        return None
    q = pad_to(q_ids.astype(jnp.int32), (q_ids.shape[0], lay.sqp))
    kv = pad_to(kv_ids.astype(jnp.int32), (kv_ids.shape[0], lay.skvp))
    return columns(q), rows(kv), columns(kv), rows(q)
