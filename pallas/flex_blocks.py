"""FlexAttention block masks as the tile tables a TPU kernel walks.

A torch ``BlockMask`` lists, for each (batch, head, q block), the kv blocks that are
partially kept (``kv_num_blocks``/``kv_indices``: mask_mod must be applied) and those
that are fully kept (``full_kv_num_blocks``/``full_kv_indices``: no mask_mod). Its batch
and head dims may be 1 (broadcast). Here those lists become:

- a block *state* (empty, partial, full) per (batch, head, q block, kv block);
- the same state per kernel *tile*: tiles are a multiple or a divisor of the mask's
  blocks (a tile is non-empty if any block under it is, full if all are; a kv tile
  that runs past the sequence end is never full, so the kernel masks its tail);
- per tile row, the non-empty kv tiles in ascending order, each entry ``2*j + full``,
  and their count (and the same per tile column for the dk/dv pass). These int32
  tables are scalar-prefetched into SMEM: index maps read them to fetch only listed
  tiles and the kernel skips the rest.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

EMPTY, PARTIAL, FULL = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Tiling:
    """Kernel tiles over the padded sequences; ``mb``/``mh`` are the mask's batch/head
    extents (1 = shared by all)."""
    bq: int
    bk: int
    nq: int
    nk: int
    mb: int
    mh: int

    @property
    def table_bytes(self) -> int:
        """SMEM the row and column tables take (int32 entries and counts)."""
        rows = self.mb * self.mh * self.nq
        cols = self.mb * self.mh * self.nk
        return 4 * (2 * rows * self.nk + rows + cols)


@dataclasses.dataclass(frozen=True)
class Tables:
    """Row tables (forward, dq) and column tables (dk/dv), flat int32."""
    row_count: jax.Array    # [mb*mh*nq]
    row_entry: jax.Array    # [mb*mh*nq*nk]: 2*kv_tile + full, non-empty first, ascending
    col_count: jax.Array    # [mb*mh*nk]
    col_entry: jax.Array    # [mb*mh*nk*nq]: 2*q_tile + full


jax.tree_util.register_dataclass(
    Tables, data_fields=["row_count", "row_entry", "col_count", "col_entry"], meta_fields=[])


def tile_size(block: int, seq: int, unit: int, target: int) -> int:
    """A tile for mask blocks of ``block`` entries: a multiple of ``unit`` that is a
    multiple or a divisor of ``block`` (so a tile's state follows from whole blocks),
    the smallest at least min(block, target), shrunk toward short sequences."""
    def ok(c):
        return c % block == 0 or block % c == 0
    lcm = unit * block // math.gcd(block, unit)
    limit = max(target, lcm if lcm <= 16 * target else 0)
    cands = [c for c in range(unit, limit + 1, unit) if ok(c)]
    if not cands:
        raise ValueError(f"no tile of {unit}-multiples fits mask blocks of {block}")
    want = min(block, target)
    t = next((c for c in cands if c >= want), cands[-1])
    seq_u = -(-seq // unit) * unit
    while t > seq_u and t // 2 % unit == 0 and ok(t // 2):
        t //= 2
    return t


def block_state(kv_num, kv_idx, full_num, full_idx, n_kv_blocks: int) -> jax.Array:
    """[mb, mh, nq_blocks, nkv_blocks] int32 state from a BlockMask's lists."""
    mb, mh, nqb = kv_num.shape

    def scatter(num, idx, val):
        valid = jnp.arange(idx.shape[-1], dtype=jnp.int32) < num[..., None]
        b = jnp.arange(mb)[:, None, None, None]
        h = jnp.arange(mh)[None, :, None, None]
        r = jnp.arange(nqb)[None, None, :, None]
        dense = jnp.zeros((mb, mh, nqb, n_kv_blocks), jnp.int32)
        return dense.at[b, h, r, jnp.clip(idx, 0, n_kv_blocks - 1)].max(
            jnp.where(valid, jnp.int32(val), jnp.int32(EMPTY)))

    state = scatter(kv_num.astype(jnp.int32), kv_idx.astype(jnp.int32), PARTIAL)
    if full_num is not None:
        state = jnp.maximum(state, scatter(full_num.astype(jnp.int32),
                                           full_idx.astype(jnp.int32), FULL))
    return state


def _retile(x, block: int, tile: int, n: int, axis: int, reduce, fill):
    """Combine the blocks under each of ``n`` tiles along ``axis`` (static geometry)."""
    nb = x.shape[axis]
    i = np.arange(n)
    first = np.minimum(i * tile // block, nb - 1)
    last = np.minimum(((i + 1) * tile - 1) // block, nb - 1)
    out = None
    for o in range(int((last - first).max()) + 1):
        part = jnp.take(x, np.minimum(first + o, nb - 1), axis=axis)
        valid = first + o <= last
        if not valid.all():
            shape = [1] * x.ndim
            shape[axis] = n
            part = jnp.where(valid.reshape(shape), part, fill)
        out = part if out is None else reduce(out, part)
    return out


def tile_state(state, block: tuple[int, int], tiling: Tiling, skv: int,
               mask_is_true: bool) -> tuple[jax.Array, jax.Array]:
    """(non-empty, full) per kernel tile, [mb, mh, nq, nk] bool each."""
    nonempty = state != EMPTY
    full = (state == FULL) | (nonempty if mask_is_true else False)
    for axis, blk, t, n in ((2, block[0], tiling.bq, tiling.nq), (3, block[1], tiling.bk, tiling.nk)):
        nonempty = _retile(nonempty, blk, t, n, axis, jnp.logical_or, False)
        full = _retile(full, blk, t, n, axis, jnp.logical_and, True)
    if skv % tiling.bk:         # the tail tile goes through the masked path (bounds)
        full = full.at[..., -1].set(False)
    return nonempty, full & nonempty


def _lists(nonempty, full):
    order = jnp.argsort(jnp.logical_not(nonempty), axis=-1, stable=True).astype(jnp.int32)
    count = jnp.sum(nonempty, axis=-1, dtype=jnp.int32)
    entry = order * 2 + jnp.take_along_axis(full, order, axis=-1).astype(jnp.int32)
    return count.reshape(-1), entry.reshape(-1)


def tables(nonempty, full) -> Tables:
    """Row and column tables of the tile states."""
    rc, re = _lists(nonempty, full)
    cc, ce = _lists(jnp.swapaxes(nonempty, -1, -2), jnp.swapaxes(full, -1, -2))
    return Tables(rc, re, cc, ce)


def fetched(nonempty) -> tuple[int, int]:
    """(tiles the kernel fetches and computes, tiles of the dense grid), per mask row
    (batch, head) summed: the work the tables skip is 1 - fetched / dense."""
    ne = np.asarray(nonempty)
    return int(ne.sum()), int(ne.size)
