"""Blocks, block tables and masks for the flash attention kernels (``flash_attention.py``).

- Sequence blocks: multiples of 128 chosen to pad each sequence as little as possible
  (a block divides the padded length), the largest such block up to the chip's target,
  halved until the three kernels' VMEM fits.
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

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.launch import pad_to
from tpu_kernels.pallas.tpu_info import round_up

Blocks = tuple[int, int]   # (bq, bk)
LANES = 128
SUBLANES = 8
_TARGET: dict[int, Blocks] = {128: (256, 512), 256: (512, 512)}   # by MXU width
# A larger block may pad this much more than the least padding 128-blocks give.
_PAD_SLACK = 1 / 16


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
    seg = 2 * (bq * LANES + SUBLANES * max(bq, bk)) * 4 if segments else 0
    fwd = (2 * (2 * bq * d + 2 * bk * d) * isz + 2 * stat   # q, o, k, v; lse out
           + 2 * stat + bq * d * 4 + 2 * bq * bk * 4 + mask)   # m, l, acc; s, p
    dq = (2 * (3 * bq * d + 2 * bk * d) * isz + 2 * 2 * stat  # q, do, dq, k, v; lse, delta
          + bq * d * 4 + 4 * bq * bk * 4 + mask)              # acc; s, p, dp, ds
    dkv = (2 * (2 * bq * d + 4 * bk * d) * isz + 2 * 2 * stat  # q, do, k, v, dk, dv
           + 2 * bk * d * 4 + 4 * bq * bk * 4 + mask)
    return max(fwd, dq, dkv) + seg


def seq_block(n: int, target: int) -> int:
    """A multiple of 128, at most ``max(target, 128)``, for a sequence of ``n``: the
    largest whose padding of ``n`` stays within ``_PAD_SLACK`` of the least padding
    (128-blocks). seq 520, target 512: 128 (pads to 640, not 1024)."""
    least = round_up(n, LANES)
    best = LANES
    for b in range(LANES, max(target, LANES) + 1, LANES):
        if round_up(n, b) <= least * (1 + _PAD_SLACK):
            best = b
    return best


def choose_blocks(sq: int, skv: int, head_dim: int, dtype, chip: tpu_info.Chip,
                  mask_itemsize: int = 0, segments: bool = False) -> Blocks:
    """(bq, bk) for these sequences on ``chip``: least-padding blocks up to the table
    entry for the chip's MXU width, halved until the kernels fit the VMEM budget."""
    tq, tk = _TARGET[128 if chip.mxu <= 128 else 256]
    budget = tpu_info.vmem_budget(chip)
    while True:
        bq, bk = seq_block(sq, tq), seq_block(skv, tk)
        if vmem_bytes((bq, bk), head_dim, dtype, mask_itemsize, segments) <= budget:
            return bq, bk
        if tk >= tq and tk > LANES:
            tk //= 2
        elif tq > LANES:
            tq //= 2
        else:
            return bq, bk


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


def band(lay: Layout, causal: bool, window: int | None) -> np.ndarray:
    """[nq, nk] bool: blocks with a kept entry under causal (top-left: col <= row) and
    the sliding window (row - col < window), rows and cols within the true lengths."""
    i = np.arange(lay.nq)[:, None]
    j = np.arange(lay.nk)[None, :]
    r0, r1 = i * lay.bq, np.minimum(i * lay.bq + lay.bq, lay.sq) - 1
    c0, c1 = j * lay.bk, np.minimum(j * lay.bk + lay.bk, lay.skv) - 1
    need = np.ones((lay.nq, lay.nk), bool)
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
    need_np = band(lay, causal, window)
    fraction = float(need_np.mean())
    need = jnp.asarray(need_np)[None]
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


# --- operand preparation -------------------------------------------------------------

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


def prep_segments(q_ids, kv_ids, lay: Layout):
    """Segment ids as the kernels read them: q ids lane-replicated [b, sqp, 128] (a column
    per q block), kv ids sublane-replicated [b, 8, skvp] (a row per kv block), int32."""
    if q_ids is None:
        return None, None
    q = pad_to(q_ids.astype(jnp.int32), (q_ids.shape[0], lay.sqp))
    kv = pad_to(kv_ids.astype(jnp.int32), (kv_ids.shape[0], lay.skvp))
    return (jnp.broadcast_to(q[:, :, None], q.shape + (LANES,)),
            jnp.broadcast_to(kv[:, None, :], (kv.shape[0], SUBLANES, kv.shape[1])))
