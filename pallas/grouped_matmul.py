"""Grouped (ragged) matmul for mixture-of-experts, as Pallas TPU kernels.

lhs [m, k] has its rows sorted by group: group i owns rows [start_i, end_i) with
end_i = sum(group_sizes[:i+1]). rhs holds the groups [offset, offset + g) (a shard of
the experts: ``group_offset``; 0 and all groups by default). Rows of no local group
come out 0.

    gmm:  out[r]  = lhs[r] @ rhs[group(r) - offset]         -> [m, n]
    tgmm: out[i]  = lhs[rows of offset+i]^T @ grad[rows]    -> [g, k, n] (0 when empty)

Row tiles of tm rows can straddle groups, so the kernels walk a *work list* of
(row tile, group) items in group order, built in the wrapper and scalar-prefetched to
SMEM, where the index_maps read it. The list is as long as the data needs: its length
is the grid's (dynamic) middle axis, so no step runs past the last item.

    for j in n tiles:                      # "parallel"
      for w in items:                      # tile ids never decrease along w, so an
        acc = sum_kk lhs[tile_w, kk] @ rhs[group_w, kk, j]   # out tile is revisited
        out[tile_w, j] = where(row in group_w, acc, out)     # only on consecutive steps

Tiles holding no local rows get zero-filling items; an item that computes nothing
(zero fill, empty group) fetches the blocks the previous item already holds, so it
moves nothing. Nothing is padded in HBM: grids are cdiv(extent, block); edge blocks
read past the arrays, and the kernels mask what could reach a kept result (a ragged k
in gmm, rows outside the group in both).
"""
from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.launch import cost, pallas_call
from tpu_kernels.pallas.matmul import _candidates, least_time, modelled_seconds
from tpu_kernels.pallas.tpu_info import round_up

Blocks = tuple[int, int, int]   # (tm, tk, tn)
_TABLE: dict[int, Blocks] = {128: (256, 512, 512), 256: (256, 1024, 1024)}   # caps, by MXU width
_SUPPORTED = ("float32", "bfloat16")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- block sizes and VMEM -------------------------------------------------------------

def vmem_bytes(blocks: Blocks, dtype) -> int:
    """Larger of the two kernels' footprints: double-buffered blocks + f32 accumulator
    (+ tgmm's f32 masked copies of its two row tiles)."""
    tm, tk, tn = (round_up(b, 128) for b in blocks)
    isz = jnp.dtype(dtype).itemsize
    gmm = 2 * (tm * tk + tk * tn + tm * tn) * isz + tm * tn * 4
    tgmm = 2 * (tm * tk + tm * tn + tk * tn) * isz + tk * tn * 4 + (tm * tk + tm * tn) * 4
    return max(gmm, tgmm)


def choose_blocks(m: int, k: int, n: int, dtype, chip: tpu_info.Chip) -> Blocks:
    """The (tm, tk, tn) with the least modelled time (``matmul.modelled_seconds``: whole
    blocks on the MXU, lhs re-read per column block, rhs per row tile, a cost per step)
    among blocks under the table's caps (tm a multiple of 128: it is tgmm's contracting
    dim; tk, tn multiples of 128 or the full extent) that fit VMEM."""
    return _choose(m, k, n, jnp.dtype(dtype).name, chip)


@functools.lru_cache(maxsize=1024)
def _choose(m: int, k: int, n: int, dtype: str, chip: tpu_info.Chip) -> Blocks:
    cm, ck, cn = _TABLE[128 if chip.mxu <= 128 else 256]
    budget = tpu_info.vmem_budget(chip)
    best = least_time(itertools.product(sorted({min(cm, round_up(m, 128)), 128}),
                                        _candidates(k, 128, ck), _candidates(n, 128, cn)),
                      lambda b: vmem_bytes(b, dtype) <= budget,
                      lambda b: modelled_seconds(m, n, k, (b[0], b[2], b[1]), dtype, chip))
    return best or (128, min(k, 128), min(n, 128))


def supports(lhs_shape, lhs_dtype, rhs_shape, rhs_dtype, group_sizes_shape,
             group_sizes_dtype="int32") -> str | None:
    """None when the kernels handle these operands (ragged_dot: lhs [m, k], rhs
    [g, k, n], group_sizes [G] integer with G >= g: with a group offset rhs holds g of
    the G groups), else the reason they do not."""
    for dt in (lhs_dtype, rhs_dtype):
        if jnp.dtype(dt).name not in _SUPPORTED:
            return f"{jnp.dtype(dt).name} not supported (f32, bf16 only)"
    if jnp.dtype(lhs_dtype) != jnp.dtype(rhs_dtype):
        return "mixed input dtypes"
    if not jnp.issubdtype(jnp.dtype(group_sizes_dtype), jnp.integer):
        return "group_sizes must be integer"
    if len(lhs_shape) != 2 or len(rhs_shape) != 3 or len(group_sizes_shape) != 1:
        return "expects lhs [m, k], rhs [g, k, n], group_sizes [g]"
    if lhs_shape[1] != rhs_shape[1] or rhs_shape[0] > group_sizes_shape[0]:
        return "shape mismatch"
    if 0 in tuple(lhs_shape) + tuple(rhs_shape):
        return "empty operand"
    return None


# --- work list (wrapper side, plain jnp on int32) ------------------------------------

def _local_groups(group_sizes, group_offset, g: int, m: int):
    """Row [start, end) of the g local groups (offset, offset + g), clipped to m."""
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.minimum(jnp.cumsum(sizes, dtype=jnp.int32), m)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    off = jnp.asarray(group_offset, jnp.int32).reshape(())
    return (jax.lax.dynamic_slice(starts, (off,), (g,)),
            jax.lax.dynamic_slice(ends, (off,), (g,)))


def _work_list(starts, ends, ntiles: int, tm: int, *, zero_fill: bool, last_kk: int):
    """Per-item int32 arrays for the kernels' grid, and the item count (the dynamic grid
    extent): (tile, group, row_start, row_end, live, fetch_tile, fetch_group, pin_kk), num.

    Entries are the local groups; with ``zero_fill`` two compute-free entries cover the
    rows before and after them, so every row tile is visited (gmm writes its zeros);
    without it an empty group gets one compute-free item (tgmm writes its zero output).
    A compute-free item fetches what the last live item held (fetch_*, its k step
    pinned to pin_kk), so it moves nothing."""
    g = starts.shape[0]
    group = jnp.arange(g, dtype=jnp.int32)
    compute = jnp.ones((g,), bool)
    if zero_fill:
        starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), starts, ends[-1:]])
        ends = jnp.concatenate([starts[1:2], ends, jnp.full((1,), ntiles * tm, jnp.int32)])
        group = jnp.concatenate([jnp.zeros((1,), jnp.int32), group, jnp.full((1,), g - 1, jnp.int32)])
        compute = jnp.concatenate([jnp.zeros((1,), bool), compute, jnp.zeros((1,), bool)])
    length = ntiles + starts.shape[0]            # static bound on the item count
    nonempty = ends > starts
    first = jnp.minimum(starts // tm, ntiles - 1)
    last = jnp.where(nonempty, (ends - 1) // tm, first)
    count = jnp.where(nonempty, last - first + 1, 0 if zero_fill else 1).astype(jnp.int32)
    num = jnp.sum(count, dtype=jnp.int32)
    entry = jnp.repeat(jnp.arange(starts.shape[0], dtype=jnp.int32), count,
                       total_repeat_length=length)
    w = jnp.arange(length, dtype=jnp.int32)
    tile = (first[entry] + w - (jnp.cumsum(count, dtype=jnp.int32) - count)[entry]).astype(jnp.int32)
    live = compute[entry] & nonempty[entry] & (w < num)
    src = jax.lax.cummax(jnp.where(live, w, -1), axis=0)
    held = src >= 0
    src = jnp.maximum(src, 0)
    fetch_tile = jnp.where(held, tile[src], tile)
    fetch_group = jnp.where(held, group[entry[src]], group[entry])
    pin_kk = jnp.where(live, -1, jnp.where(held, last_kk, 0)).astype(jnp.int32)
    meta = (tile, group[entry], starts[entry], ends[entry], live.astype(jnp.int32),
            fetch_tile, fetch_group, pin_kk)
    return tuple(x.astype(jnp.int32) for x in meta), num


def _row_mask(shape, tile, tm, start, end):
    rows = jax.lax.broadcasted_iota(jnp.int32, shape, 0) + tile * tm
    return (rows >= start) & (rows < end)


def _mask_k(x, axis: int, kk, tk: int, k: int):
    idx = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis) + kk * tk
    return jnp.where(idx < k, x, jnp.zeros_like(x))


# --- gmm ----------------------------------------------------------------------------------

def _gmm_kernel(tile_ref, group_ref, start_ref, end_ref, live_ref, ftile_ref, fgroup_ref,
                pin_ref, lhs_ref, rhs_ref, out_ref, acc_ref, *, tm, tk, k, transpose_rhs,
                precision):
    w, kk = pl.program_id(1), pl.program_id(2)
    last_kk = pl.num_programs(2) - 1
    tile, start, end = tile_ref[w], start_ref[w], end_ref[w]
    live = live_ref[w] == 1
    rhs_k = 1 if transpose_rhs else 0

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def accumulate(ragged: bool):
        x, y = lhs_ref[...], rhs_ref[...]
        if ragged:          # past k lies whatever follows the array: zero both sides
            x, y = _mask_k(x, 1, kk, tk, k), _mask_k(y, rhs_k, kk, tk, k)
        acc_ref[...] += jax.lax.dot_general(x, y, (((1,), (rhs_k,)), ((), ())),
                                            precision=precision,
                                            preferred_element_type=jnp.float32)

    if k % tk:
        pl.when(live & (kk < last_kk))(lambda: accumulate(False))
        pl.when(live & (kk == last_kk))(lambda: accumulate(True))
    else:
        pl.when(live)(lambda: accumulate(False))

    @pl.when(kk == last_kk)
    def _store():
        first_visit = (w == 0) | (tile != tile_ref[jnp.maximum(w - 1, 0)])
        old = jnp.where(first_visit, 0.0, out_ref[...].astype(jnp.float32))
        inside = _row_mask(acc_ref.shape, tile, tm, start, end) & live
        out_ref[...] = jnp.where(inside, acc_ref[...], old).astype(out_ref.dtype)


def _cost(m: int, k: int, n: int, groups: int, blocks: Blocks, dtype):
    """FLOPs of whole blocks over every row tile; HBM traffic: lhs re-read per column
    block, each group's rhs once per row tile it covers (about m / tm + groups items)."""
    tm, tk, tn = blocks
    tiles, gk, gn = _cdiv(m, tm), _cdiv(k, tk), _cdiv(n, tn)
    isz = jnp.dtype(dtype).itemsize
    traffic = (m * k * gn + (tiles + groups) * k * n + m * n) * isz
    return cost(2 * tiles * tm * gk * tk * gn * tn, traffic)


def _kk(kk, pin):
    return jnp.where(pin < 0, kk, pin)


def _gmm_call(lhs, rhs, meta, num, *, blocks, transpose_rhs, precision, target):
    """lhs [m, k], rhs [g, k, n] (or [g, n, k] transposed), unpadded."""
    tm, tk, tn = blocks
    m, k = lhs.shape
    g = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]

    def lhs_map(j, w, kk, tile, group, start, end, live, ftile, fgroup, pin):
        return ftile[w], _kk(kk, pin[w])

    def rhs_map(j, w, kk, tile, group, start, end, live, ftile, fgroup, pin):
        kb = _kk(kk, pin[w])
        return (fgroup[w], j, kb) if transpose_rhs else (fgroup[w], kb, j)

    rhs_block = (None, tn, tk) if transpose_rhs else (None, tk, tn)
    kernel = functools.partial(_gmm_kernel, tm=tm, tk=tk, k=k, transpose_rhs=transpose_rhs,
                               precision=precision)
    return pallas_call(
        kernel,
        target=target,
        name="gmm",
        cost_estimate=_cost(m, k, n, g, blocks, lhs.dtype),
        vmem_bytes=vmem_bytes(blocks, lhs.dtype),
        dimension_semantics=("parallel", "arbitrary", "arbitrary"),
        out_shape=jax.ShapeDtypeStruct((m, n), lhs.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(meta),
            grid=(_cdiv(n, tn), num, _cdiv(k, tk)),
            in_specs=[pl.BlockSpec((tm, tk), lhs_map), pl.BlockSpec(rhs_block, rhs_map)],
            out_specs=pl.BlockSpec((tm, tn), lambda j, w, kk, tile, *_: (tile[w], j)),
            scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
        ),
    )(*meta, lhs, rhs)


# --- tgmm ---------------------------------------------------------------------------------

def _tgmm_kernel(tile_ref, group_ref, start_ref, end_ref, live_ref, ftile_ref, fgroup_ref,
                 pin_ref, lhs_ref, grad_ref, out_ref, acc_ref, *, tm, precision):
    w = pl.program_id(2)
    last_w = pl.num_programs(2) - 1
    grp, tile, start, end = group_ref[w], tile_ref[w], start_ref[w], end_ref[w]

    @pl.when((w == 0) | (grp != group_ref[jnp.maximum(w - 1, 0)]))
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(live_ref[w] == 1)
    def _accumulate():
        x = jnp.where(_row_mask(lhs_ref.shape, tile, tm, start, end), lhs_ref[...], 0)
        y = jnp.where(_row_mask(grad_ref.shape, tile, tm, start, end), grad_ref[...], 0)
        acc_ref[...] += jax.lax.dot_general(x, y, (((0,), (0,)), ((), ())),
                                            precision=precision,
                                            preferred_element_type=jnp.float32)

    @pl.when((w == last_w) | (grp != group_ref[jnp.minimum(w + 1, last_w)]))
    def _store():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


def _tgmm_call(lhs, grad, meta, num, num_groups, *, blocks, precision, target):
    """lhs [m, k], grad [m, n] -> [g, k, n]; unpadded."""
    tm, tk, tn = blocks
    m, k = lhs.shape
    n = grad.shape[1]
    kernel = functools.partial(_tgmm_kernel, tm=tm, precision=precision)
    return pallas_call(
        kernel,
        target=target,
        name="tgmm",
        cost_estimate=_cost(m, k, n, num_groups, blocks, lhs.dtype),
        vmem_bytes=vmem_bytes(blocks, lhs.dtype),
        dimension_semantics=("parallel", "parallel", "arbitrary"),
        out_shape=jax.ShapeDtypeStruct((num_groups, k, n), lhs.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(meta),
            grid=(_cdiv(k, tk), _cdiv(n, tn), num),
            in_specs=[pl.BlockSpec((tm, tk), lambda i, j, w, tile, group, s, e, live, ftile, *_: (ftile[w], i)),
                      pl.BlockSpec((tm, tn), lambda i, j, w, tile, group, s, e, live, ftile, *_: (ftile[w], j))],
            out_specs=pl.BlockSpec((None, tk, tn),
                                   lambda i, j, w, tile, group, *_: (group[w], i, j)),
            scratch_shapes=[pltpu.VMEM((tk, tn), jnp.float32)],
        ),
    )(*meta, lhs, grad)


# --- wrappers -------------------------------------------------------------------------------

def gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
        transpose_rhs: bool = False, group_offset: jax.Array | int = 0,
        block: Blocks | None = None, interpret: bool | None = None) -> jax.Array:
    """out[r] = lhs[r] @ rhs[group(r) - group_offset] (its transpose when transpose_rhs,
    rhs [g, n, k]); lhs [m, k] rows sorted by group; rows outside the local groups
    [group_offset, group_offset + g) give 0."""
    m, k = lhs.shape
    g = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    target = tpu_info.target(interpret)
    tm, tk, tn = block or choose_blocks(m, k, n, lhs.dtype, target.chip)
    starts, ends = _local_groups(group_sizes, group_offset, g, m)
    meta, num = _work_list(starts, ends, _cdiv(m, tm), tm, zero_fill=True,
                           last_kk=_cdiv(k, tk) - 1)
    return _gmm_call(lhs, rhs, meta, num, blocks=(tm, tk, tn), transpose_rhs=transpose_rhs,
                     precision=tpu_info.mxu_precision(lhs.dtype), target=target)


def tgmm(lhs: jax.Array, grad: jax.Array, group_sizes: jax.Array, *,
         num_groups: int | None = None, group_offset: jax.Array | int = 0,
         block: Blocks | None = None, interpret: bool | None = None) -> jax.Array:
    """out[i] = lhs[rows of group_offset + i]^T @ grad[those rows] -> [num_groups, k, n]
    (the rhs gradient of gmm; num_groups defaults to all groups); empty groups give 0."""
    m, k = lhs.shape
    n = grad.shape[1]
    g = group_sizes.shape[0] if num_groups is None else num_groups
    target = tpu_info.target(interpret)
    tm, tk, tn = block or choose_blocks(m, k, n, lhs.dtype, target.chip)
    starts, ends = _local_groups(group_sizes, group_offset, g, m)
    meta, num = _work_list(starts, ends, _cdiv(m, tm), tm, zero_fill=False, last_kk=0)
    return _tgmm_call(lhs, grad.astype(lhs.dtype), meta, num, g, blocks=(tm, tk, tn),
                      precision=tpu_info.mxu_precision(lhs.dtype), target=target)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _ragged_dot(lhs, rhs, group_sizes, group_offset, block, interpret):
    return gmm(lhs, rhs, group_sizes, group_offset=group_offset, block=block, interpret=interpret)


def _ragged_dot_fwd(lhs, rhs, group_sizes, group_offset, block, interpret):
    out = _ragged_dot(lhs, rhs, group_sizes, group_offset, block, interpret)
    return out, (lhs, rhs, group_sizes, group_offset)


def _ragged_dot_bwd(block, interpret, res, g):
    """dlhs = g @ rhs[group]^T (gmm reading rhs as [n, k]); drhs = tgmm(lhs, g)."""
    lhs, rhs, group_sizes, group_offset = res
    g = g.astype(lhs.dtype)
    dlhs = gmm(g, rhs, group_sizes, transpose_rhs=True, group_offset=group_offset,
               interpret=interpret)
    drhs = tgmm(lhs, g, group_sizes, num_groups=rhs.shape[0], group_offset=group_offset,
                interpret=interpret)
    return dlhs, drhs, None, None


_ragged_dot.defvjp(_ragged_dot_fwd, _ragged_dot_bwd)


def ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
               group_offset: jax.Array | int = 0, block: Blocks | None = None,
               interpret: bool | None = None) -> jax.Array:
    """Differentiable grouped matmul (tpu_kernels.ragged_dot): lhs [m, k] rows sorted
    by group, rhs [g, k, n] the groups [group_offset, group_offset + g) of the G that
    group_sizes [G] describes (g == G unless experts are sharded) -> [m, n], 0 on rows
    of other groups. Backward runs gmm (NT) and tgmm."""
    reason = supports(lhs.shape, lhs.dtype, rhs.shape, rhs.dtype, group_sizes.shape,
                      group_sizes.dtype)
    if reason:
        raise ValueError(f"pallas ragged_dot: {reason} (lhs {lhs.shape} {lhs.dtype}, rhs "
                         f"{rhs.shape} {rhs.dtype}, group_sizes {group_sizes.shape} "
                         f"{group_sizes.dtype}); use jax.lax.ragged_dot for these operands")
    return _ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32),
                       jnp.asarray(group_offset, jnp.int32),
                       None if block is None else tuple(block), interpret)
