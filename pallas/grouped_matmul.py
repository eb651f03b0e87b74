"""Grouped (ragged) matmul for mixture-of-experts, as Pallas TPU kernels.

lhs [m, k] has its rows sorted by group: group i owns rows [start_i, end_i) with
end_i = sum(group_sizes[:i+1]). Rows past sum(group_sizes) belong to no group.

    gmm:  out[r]  = lhs[r] @ rhs[group(r)]                 -> [m, n]   (0 outside groups)
    tgmm: out[i]  = lhs[rows of i]^T @ grad[rows of i]     -> [g, k, n] (0 for empty groups)

Row tiles of tm rows can straddle groups, so the kernels walk a *work list* of
(row tile, group) pairs in group order, built in the wrapper and scalar-prefetched to
SMEM, where the index_maps read it to pick the lhs tile and the group's rhs:

    for j in n tiles:                      # "parallel"
      for w in work items:                 # tile ids never decrease along w, so an
        acc = sum_kk lhs[tile_w, kk] @ rhs[group_w, kk, j]   # out tile is revisited
        out[tile_w, j] = where(row in group_w, acc, out)     # only on consecutive steps

The first visit of a tile writes zeros outside its group, so rows of no group come out
0. The list has a static length (tiles + groups); unused tail entries repeat the last
real entry with compute switched off, so they fetch nothing new.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.launch import cost, pad_to, pallas_call
from tpu_kernels.pallas.tpu_info import round_up

Blocks = tuple[int, int, int]   # (tm, tk, tn)
_TABLE: dict[int, Blocks] = {128: (256, 512, 512), 256: (256, 1024, 1024)}   # by MXU width
_SUPPORTED = ("float32", "bfloat16")


# --- block sizes and VMEM -------------------------------------------------------------

def vmem_bytes(blocks: Blocks, dtype) -> int:
    """Larger of the two kernels' footprints: double-buffered blocks + f32 accumulator
    (+ tgmm's f32 masked copies of its two row tiles)."""
    tm, tk, tn = blocks
    isz = jnp.dtype(dtype).itemsize
    gmm = 2 * (tm * tk + tk * tn + tm * tn) * isz + tm * tn * 4
    tgmm = 2 * (tm * tk + tm * tn + tk * tn) * isz + tk * tn * 4 + (tm * tk + tm * tn) * 4
    return max(gmm, tgmm)


def choose_blocks(m: int, k: int, n: int, dtype, chip: tpu_info.Chip) -> Blocks:
    """Table entry by MXU width, clamped to the padded problem (all multiples of 128:
    tm is tgmm's contracting dim), halved (largest first) until it fits VMEM."""
    tm, tk, tn = _TABLE[128 if chip.mxu <= 128 else 256]
    tm, tk, tn = min(tm, round_up(m, 128)), min(tk, round_up(k, 128)), min(tn, round_up(n, 128))
    budget = tpu_info.vmem_budget(chip)
    while vmem_bytes((tm, tk, tn), dtype) > budget:
        if tk >= tn and tk > 128:
            tk //= 2
        elif tn > 128:
            tn //= 2
        elif tm > 128:
            tm //= 2
        else:
            break
    return tm, tk, tn


def supports(lhs_shape, lhs_dtype, rhs_shape, rhs_dtype, group_sizes_shape,
             group_sizes_dtype="int32") -> str | None:
    """None when the kernels handle these operands (ragged_dot: lhs [m, k], rhs
    [g, k, n], group_sizes [g] integer), else the reason they do not."""
    for dt in (lhs_dtype, rhs_dtype):
        if jnp.dtype(dt).name not in _SUPPORTED:
            return f"{jnp.dtype(dt).name} not supported (f32, bf16 only)"
    if jnp.dtype(lhs_dtype) != jnp.dtype(rhs_dtype):
        return "mixed input dtypes"
    if not jnp.issubdtype(jnp.dtype(group_sizes_dtype), jnp.integer):
        return "group_sizes must be integer"
    if len(lhs_shape) != 2 or len(rhs_shape) != 3 or len(group_sizes_shape) != 1:
        return "expects lhs [m, k], rhs [g, k, n], group_sizes [g]"
    if lhs_shape[1] != rhs_shape[1] or rhs_shape[0] != group_sizes_shape[0]:
        return "shape mismatch"
    if 0 in tuple(lhs_shape) + tuple(rhs_shape):
        return "empty operand"
    return None


# --- work list (wrapper side, plain jnp on int32) ------------------------------------

def _work_list(group_sizes, m: int, mp: int, tm: int, *, with_tail: bool, visit_empty: bool):
    """(item_group, item_tile, row_start, row_end, num_items) for the kernels' grid.

    with_tail adds a pseudo-group g covering rows [sum(group_sizes), mp) so every row
    tile is visited (gmm zero-fills it); visit_empty gives empty groups one item (tgmm
    must write their zero output)."""
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.minimum(jnp.cumsum(sizes, dtype=jnp.int32), m)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    if with_tail:
        starts = jnp.concatenate([starts, ends[-1:]])
        ends = jnp.concatenate([ends, jnp.full((1,), mp, jnp.int32)])
    ntiles, ngroups = mp // tm, starts.shape[0]
    length = ntiles + group_sizes.shape[0]        # static bound on the item count
    nonempty = ends > starts
    first = jnp.minimum(starts // tm, ntiles - 1)
    last = jnp.where(nonempty, (ends - 1) // tm, first)
    count = jnp.where(nonempty, last - first + 1, 1 if visit_empty else 0).astype(jnp.int32)
    num = jnp.sum(count, dtype=jnp.int32)
    group = jnp.repeat(jnp.arange(ngroups, dtype=jnp.int32), count,
                       total_repeat_length=length)
    w = jnp.arange(length, dtype=jnp.int32)
    tile = first[group] + w - (jnp.cumsum(count, dtype=jnp.int32) - count)[group]
    # Tail entries repeat the last real one (same blocks, compute off).
    tail = w >= num
    group = jnp.where(tail, group[num - 1], group)
    tile = jnp.where(tail, tile[num - 1], tile).astype(jnp.int32)
    return group, tile, starts, ends, num.reshape(1)


def _row_mask(shape, tile, tm, start, end):
    rows = jax.lax.broadcasted_iota(jnp.int32, shape, 0) + tile * tm
    return (rows >= start) & (rows < end)


# --- gmm ----------------------------------------------------------------------------------

def _gmm_kernel(group_ref, tile_ref, start_ref, end_ref, num_ref, lhs_ref, rhs_ref, out_ref,
                acc_ref, *, tm, num_groups, transpose_rhs, precision):
    w, kk = pl.program_id(1), pl.program_id(2)
    grp, tile = group_ref[w], tile_ref[w]
    start, end = start_ref[grp], end_ref[grp]
    active = (w < num_ref[0]) & (grp < num_groups) & (end > start)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(active)
    def _accumulate():
        dims = (((1,), (1,)), ((), ())) if transpose_rhs else (((1,), (0,)), ((), ()))
        acc_ref[...] += jax.lax.dot_general(lhs_ref[...], rhs_ref[...], dims,
                                            precision=precision,
                                            preferred_element_type=jnp.float32)

    @pl.when(kk == pl.num_programs(2) - 1)
    def _store():
        first_visit = (w == 0) | (tile != tile_ref[jnp.maximum(w - 1, 0)])
        old = jnp.where(first_visit, 0.0, out_ref[...].astype(jnp.float32))
        inside = _row_mask(acc_ref.shape, tile, tm, start, end) & active
        out_ref[...] = jnp.where(inside, acc_ref[...], old).astype(out_ref.dtype)


def _cost(m: int, k: int, n: int, groups: int, blocks: Blocks, dtype):
    """Every row against one group's [k, n] slice; lhs re-read per column block, each
    group's rhs once per row tile it covers (about m / tm + groups tiles in all)."""
    tm, tk, tn = blocks
    isz = jnp.dtype(dtype).itemsize
    tiles = m // tm + groups
    traffic = (m * k * (n // tn) + tiles * tk * tn * (k // tk) * (n // tn) + m * n) * isz
    return cost(2 * m * k * n, traffic)


def _gmm_call(lhs, rhs, meta, *, blocks, transpose_rhs, precision, target):
    """lhs [mp, kp], rhs [g, kp, np] (or [g, np, kp] transposed), padded to blocks."""
    tm, tk, tn = blocks
    mp, kp = lhs.shape
    g = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    length = meta[0].shape[0]

    def rhs_map(j, w, kk, group, tile, *_):
        grp = jnp.minimum(group[w], g - 1)
        return (grp, j, kk) if transpose_rhs else (grp, kk, j)

    rhs_block = (None, tn, tk) if transpose_rhs else (None, tk, tn)
    kernel = functools.partial(_gmm_kernel, tm=tm, num_groups=g, transpose_rhs=transpose_rhs,
                               precision=precision)
    return pallas_call(
        kernel,
        target=target,
        name="gmm",
        cost_estimate=_cost(mp, kp, n, g, blocks, lhs.dtype),
        vmem_bytes=vmem_bytes(blocks, lhs.dtype),
        dimension_semantics=("parallel", "arbitrary", "arbitrary"),
        out_shape=jax.ShapeDtypeStruct((mp, n), lhs.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(meta),
            grid=(n // tn, length, kp // tk),
            in_specs=[pl.BlockSpec((tm, tk), lambda j, w, kk, group, tile, *_: (tile[w], kk)),
                      pl.BlockSpec(rhs_block, rhs_map)],
            out_specs=pl.BlockSpec((tm, tn), lambda j, w, kk, group, tile, *_: (tile[w], j)),
            scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
        ),
    )(*meta, lhs, rhs)


# --- tgmm ---------------------------------------------------------------------------------

def _tgmm_kernel(group_ref, tile_ref, start_ref, end_ref, num_ref, lhs_ref, grad_ref, out_ref,
                 acc_ref, *, tm, precision):
    w = pl.program_id(2)
    last_w = pl.num_programs(2) - 1
    grp, tile = group_ref[w], tile_ref[w]
    start, end = start_ref[grp], end_ref[grp]

    @pl.when((w == 0) | (grp != group_ref[jnp.maximum(w - 1, 0)]))
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when((w < num_ref[0]) & (end > start))
    def _accumulate():
        x = jnp.where(_row_mask(lhs_ref.shape, tile, tm, start, end), lhs_ref[...], 0)
        y = jnp.where(_row_mask(grad_ref.shape, tile, tm, start, end), grad_ref[...], 0)
        acc_ref[...] += jax.lax.dot_general(x, y, (((0,), (0,)), ((), ())),
                                            precision=precision,
                                            preferred_element_type=jnp.float32)

    @pl.when((w == last_w) | (grp != group_ref[jnp.minimum(w + 1, last_w)]))
    def _store():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


def _tgmm_call(lhs, grad, meta, num_groups, *, blocks, precision, target):
    """lhs [mp, kp], grad [mp, np] -> [g, kp, np]; padded to blocks."""
    tm, tk, tn = blocks
    mp, kp = lhs.shape
    n = grad.shape[1]
    length = meta[0].shape[0]
    kernel = functools.partial(_tgmm_kernel, tm=tm, precision=precision)
    return pallas_call(
        kernel,
        target=target,
        name="tgmm",
        cost_estimate=_cost(mp, kp, n, num_groups, blocks, lhs.dtype),
        vmem_bytes=vmem_bytes(blocks, lhs.dtype),
        dimension_semantics=("parallel", "parallel", "arbitrary"),
        out_shape=jax.ShapeDtypeStruct((num_groups, kp, n), lhs.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(meta),
            grid=(kp // tk, n // tn, length),
            in_specs=[pl.BlockSpec((tm, tk), lambda i, j, w, group, tile, *_: (tile[w], i)),
                      pl.BlockSpec((tm, tn), lambda i, j, w, group, tile, *_: (tile[w], j))],
            out_specs=pl.BlockSpec((None, tk, tn),
                                   lambda i, j, w, group, tile, *_: (group[w], i, j)),
            scratch_shapes=[pltpu.VMEM((tk, tn), jnp.float32)],
        ),
    )(*meta, lhs, grad)


# --- wrappers -------------------------------------------------------------------------------

def _precision(dtype):
    return (jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32
            else jax.lax.Precision.DEFAULT)


def gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
        transpose_rhs: bool = False, block: Blocks | None = None,
        interpret: bool | None = None) -> jax.Array:
    """out[r] = lhs[r] @ rhs[group(r)] (rhs[group(r)]^T when transpose_rhs, rhs
    [g, n, k]); lhs [m, k] rows sorted by group; rows outside every group give 0."""
    m, k = lhs.shape
    g = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    target = tpu_info.target(interpret)
    tm, tk, tn = block or choose_blocks(m, k, n, lhs.dtype, target.chip)
    mp, kp, np_ = round_up(m, tm), round_up(k, tk), round_up(n, tn)
    meta = _work_list(group_sizes, m, mp, tm, with_tail=True, visit_empty=False)
    rhs = pad_to(rhs, (g, np_, kp) if transpose_rhs else (g, kp, np_))
    out = _gmm_call(pad_to(lhs, (mp, kp)), rhs, meta, blocks=(tm, tk, tn),
                    transpose_rhs=transpose_rhs, precision=_precision(lhs.dtype),
                    target=target)
    return out[:m, :n]


def tgmm(lhs: jax.Array, grad: jax.Array, group_sizes: jax.Array, *,
         block: Blocks | None = None, interpret: bool | None = None) -> jax.Array:
    """out[i] = lhs[rows of i]^T @ grad[rows of i] -> [g, k, n] (the rhs gradient of
    gmm); empty groups give zeros."""
    m, k = lhs.shape
    n = grad.shape[1]
    g = group_sizes.shape[0]
    target = tpu_info.target(interpret)
    tm, tk, tn = block or choose_blocks(m, k, n, lhs.dtype, target.chip)
    mp, kp, np_ = round_up(m, tm), round_up(k, tk), round_up(n, tn)
    meta = _work_list(group_sizes, m, mp, tm, with_tail=False, visit_empty=True)
    out = _tgmm_call(pad_to(lhs, (mp, kp)), pad_to(grad.astype(lhs.dtype), (mp, np_)), meta, g,
                     blocks=(tm, tk, tn), precision=_precision(lhs.dtype), target=target)
    return out[:, :k, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _ragged_dot(lhs, rhs, group_sizes, block, interpret):
    return gmm(lhs, rhs, group_sizes, block=block, interpret=interpret)


def _ragged_dot_fwd(lhs, rhs, group_sizes, block, interpret):
    return _ragged_dot(lhs, rhs, group_sizes, block, interpret), (lhs, rhs, group_sizes)


def _ragged_dot_bwd(block, interpret, res, g):
    """dlhs = g @ rhs[group]^T (gmm, transposed rhs); drhs = tgmm(lhs, g)."""
    lhs, rhs, group_sizes = res
    g = g.astype(lhs.dtype)
    dlhs = gmm(g, rhs, group_sizes, transpose_rhs=True, interpret=interpret)
    drhs = tgmm(lhs, g, group_sizes, interpret=interpret)
    return dlhs, drhs, None


_ragged_dot.defvjp(_ragged_dot_fwd, _ragged_dot_bwd)


def ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
               block: Blocks | None = None, interpret: bool | None = None) -> jax.Array:
    """Differentiable grouped matmul (tpu_kernels.ragged_dot): lhs [m, k] rows sorted
    by group, rhs [g, k, n], group_sizes [g] -> [m, n]. Backward runs gmm and tgmm."""
    reason = supports(lhs.shape, lhs.dtype, rhs.shape, rhs.dtype, group_sizes.shape,
                      group_sizes.dtype)
    if reason:
        raise ValueError(f"pallas ragged_dot: {reason}")
    return _ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32),
                       None if block is None else tuple(block), interpret)
