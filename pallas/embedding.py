"""Embedding lookup (row gather) and its dense backward (scatter-add) as Pallas kernels.

Mosaic DMAs 32-bit rows one at a time, but packed rows (bf16: two rows per 32-bit sublane)
only in whole tiles: a slice of the row dim of a bf16 table must start and end on a
16-row boundary. So rows travel in slabs of S rows (S = 1 for f32, 16 for bf16), and the
kernels pick the row out of its slab in VMEM.

Forward: the flat indices are scalar-prefetched to SMEM; grid step i gathers rows
idx[i*R .. i*R+R):
    for r < R:  DMA slab idx[r] // S of the HBM table -> buf[r]            (S rows each)
    out[r] = buf[r][idx[r] % S]          (a masked sublane sum: the select stays in VMEM)
A bf16 table is read S times over (the price of tile-aligned DMAs; XLA's gather is the
alternative).

Backward (scatter-add with duplicates), by tiles of S output rows:
    perm = argsort(idx) (stable), key = idx[perm], G = grad[perm]   -- wrapper (XLA gather)
    acc <- 0 (f32 [S, dim]), cnt <- 0
    for p in 0..n-1 (grid steps of R sorted rows of G, "arbitrary": acc carries over):
        acc[key[p] % S] += G[p]  (not when key[p] == padding_idx);  cnt += 1
        if key[p+1] != key[p]:  acc[key[p] % S] /= cnt if scale_grad_by_freq;  cnt <- 0
        if key[p+1] // S != key[p] // S:  DMA acc -> out tile key[p] // S;  acc <- 0
Keys are sorted, so each output tile is written once, whole; tiles never indexed keep
the zeros the output aliases. A table whose row count is not a multiple of S is padded
in the wrapper (one copy of it per call).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.launch import cost, pad_to, pallas_call
from tpu_kernels.pallas.tpu_info import round_up

_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
MAX_TOKENS = 32768          # indices (+ permutation) live in SMEM, about 1 MiB in all
_MAX_ROWS = 32              # rows (DMAs) per grid step; the per-row loop is unrolled
_STEP_BYTES = 512 * 1024    # aim for about this much row data per grid step


def slab_rows(dtype) -> int:
    """Rows one DMA moves: 1 for 32-bit rows, a whole (16, 128) tile for bf16."""
    return 1 if jnp.dtype(dtype).itemsize == 4 else tpu_info.sublane(dtype)


def rows_per_step(n: int, dim: int, dtype) -> int:
    """Rows gathered/scattered per grid step: a multiple of the sublane tile, enough to move
    about ``_STEP_BYTES`` but no more than the (rounded-up) token count."""
    sub = tpu_info.sublane(dtype)
    by_bytes = _STEP_BYTES // max(1, dim * jnp.dtype(dtype).itemsize)
    rows = max(sub, min(_MAX_ROWS, by_bytes) // sub * sub)
    return min(rows, round_up(n, sub))


def vmem_bytes(rows: int, dim: int, dtype) -> int:
    """Larger of forward (double-buffered [rows, dim] output, rows slabs) and backward
    (double-buffered [rows, dim] grad block, rows staged slabs, the f32 tile accumulator)."""
    sub = slab_rows(dtype)
    block = tpu_info.tile_bytes((rows, dim), dtype)
    slabs = rows * tpu_info.tile_bytes((sub, dim), dtype)    # each padded to a tile
    acc = tpu_info.tile_bytes((sub, dim), jnp.float32)
    return 2 * block + slabs + acc


def supports(weight_shape: tuple[int, ...], weight_dtype, indices_shape: tuple[int, ...],
             indices_dtype, *, chip: tpu_info.Chip | str = tpu_info.INTERPRET_CHIP) -> str | None:
    """None when the kernels handle these arguments (forward and backward), else why not.
    For the backward pass ``weight_shape = (num_weights, dim)`` and the grad dtype."""
    if len(weight_shape) != 2:
        return "weight must be 2-D [num_weights, dim]"
    if jnp.dtype(weight_dtype) not in _DTYPES:
        return f"dtype {jnp.dtype(weight_dtype)} not in float32/bfloat16"
    if not jnp.issubdtype(jnp.dtype(indices_dtype), jnp.integer):
        return "indices must be integers"
    num_weights, dim = weight_shape
    if num_weights >= 2**31:
        return "num_weights >= 2**31 does not fit the int32 indices the TPU kernel uses"
    n = 1
    for d in indices_shape:
        n *= d
    if n == 0 or num_weights == 0 or dim == 0:
        return "empty weight or indices"
    if n > MAX_TOKENS:
        return f"{n} indices > {MAX_TOKENS}: index tables must fit SMEM"
    rows = rows_per_step(n, dim, weight_dtype)
    if vmem_bytes(rows, dim, weight_dtype) > tpu_info.vmem_budget(tpu_info.chip(chip)):
        return f"dim {dim} too wide for VMEM"
    return None


def _check(weight_shape, dtype, indices, chip):
    reason = supports(weight_shape, dtype, indices.shape, indices.dtype, chip=chip)
    if reason:
        raise ValueError(f"embedding kernel: {reason} (weight {tuple(weight_shape)} {dtype}, "
                         f"indices {tuple(indices.shape)} {indices.dtype})")


def _div(a, b: int):
    """a // b for non-negative int32 scalars (truncating: no sign logic to lower)."""
    return lax.div(a, jnp.int32(b))


def _rem(a, b: int):
    return lax.rem(a, jnp.int32(b))


def _slab(table, tile, sub: int):
    """The ``sub``-row, tile-aligned slice number ``tile`` of a 2-D HBM ref."""
    return table.at[pl.ds(pl.multiple_of(tile * sub, sub), sub)]


def _row_of(slab, off, sub: int):
    """Row ``off`` of a [sub, dim] slab, as f32 [1, dim] (only that row survives the mask)."""
    rows = lax.broadcasted_iota(jnp.int32, slab.shape, 0)
    return jnp.sum(jnp.where(rows == off, slab.astype(jnp.float32), 0.0), axis=0, keepdims=True)


# ----------------------------------------------------------------------------- forward

def _gather_kernel(idx_ref, w_hbm, out_ref, buf, sems, *, rows: int, sub: int):
    base = pl.program_id(0) * rows
    # 32-bit rows land in the output block directly; packed ones in their slab
    dst = (lambda r: out_ref.at[pl.ds(r, 1)]) if sub == 1 else (lambda r: buf.at[r])
    copies = [pltpu.make_async_copy(_slab(w_hbm, _div(idx_ref[base + r], sub), sub), dst(r),
                                    sems.at[r]) for r in range(rows)]
    for c in copies:          # all DMAs in flight before the first wait
        c.start()
    for c in copies:
        c.wait()
    if sub == 1:
        return
    picked = lax.broadcasted_iota(jnp.int32, (sub, out_ref.shape[1]), 0)
    for t in range(rows // sub):  # assemble whole [sub, dim] tiles: aligned stores only
        def place(r, tile, t=t):
            row = _row_of(buf[t * sub + r], _rem(idx_ref[base + t * sub + r], sub), sub)
            return jnp.where(picked == r, row, tile)
        tile = lax.fori_loop(0, sub, place, jnp.zeros((sub, out_ref.shape[1]), jnp.float32))
        out_ref[pl.ds(t * sub, sub), :] = tile.astype(out_ref.dtype)


def _gather(weight, idx, tgt: tpu_info.Target):
    n, (num_weights, dim) = idx.shape[0], weight.shape
    sub = slab_rows(weight.dtype)
    rows = rows_per_step(n, dim, weight.dtype)
    steps = pl.cdiv(n, rows)
    # Pad to whole steps (rows past n land in the masked tail of the last block); clip so
    # a bad index cannot DMA outside the table.
    idx = jnp.pad(jnp.clip(idx, 0, num_weights - 1), (0, steps * rows - n))
    table = pad_to(weight, (round_up(num_weights, sub), dim))
    isz = weight.dtype.itemsize
    return pallas_call(
        functools.partial(_gather_kernel, rows=rows, sub=sub),
        target=tgt,
        name="embedding_gather",
        cost_estimate=cost(2 * n * sub * dim, n * (sub + 1) * dim * isz),
        vmem_bytes=vmem_bytes(rows, dim, weight.dtype),
        dimension_semantics=("parallel",),
        out_shape=jax.ShapeDtypeStruct((n, dim), weight.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(steps,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((rows, dim), lambda i, idx_ref: (i, 0)),
            scratch_shapes=[pltpu.VMEM((rows, sub, dim) if sub > 1 else (1, 1, 128),
                                       weight.dtype),
                            pltpu.SemaphoreType.DMA((rows,))]),
    )(idx, table)


# ---------------------------------------------------------------------------- backward

def _scatter_kernel(key_ref, g_ref, _zeros, out_hbm, stage, acc, cnt, flushed, sems, *,
                    rows: int, sub: int, n: int, padding_idx: int, scale: bool):
    base = pl.program_id(0) * rows

    @pl.when(pl.program_id(0) == 0)
    def _init():
        acc[...] = jnp.zeros(acc.shape, jnp.float32)
        cnt[0] = 0

    at = lax.broadcasted_iota(jnp.int32, acc.shape, 0)
    for r in range(rows):     # sequential over sorted positions: runs of equal keys
        pos, flushed[r] = base + r, 0

        @pl.when(pos < n)
        def _accumulate(r=r, pos=pos):
            key, nxt = key_ref[pos], key_ref[pos + 1]
            off = _rem(key, sub)
            row = g_ref[pl.ds(r, 1), :].astype(jnp.float32)
            acc[...] += jnp.where((at == off) & (key != padding_idx), row, 0.0)
            cnt[0] += 1

            @pl.when(nxt != key)                    # last of its run
            def _end_of_run():
                if scale:
                    acc[...] = jnp.where(at == off, acc[...] / cnt[0].astype(jnp.float32),
                                         acc[...])
                cnt[0] = 0

            @pl.when((nxt < 0) | (_div(nxt, sub) != _div(key, sub)))   # last of its tile
            def _flush():
                stage[r] = acc[...].astype(stage.dtype)
                pltpu.make_async_copy(stage.at[r], _slab(out_hbm, _div(key, sub), sub),
                                      sems.at[r]).start()
                flushed[r] = 1
                acc[...] = jnp.zeros(acc.shape, jnp.float32)

    for r in range(rows):     # stage is reused next step: finish this step's writes
        @pl.when(flushed[r] == 1)
        def _wait(r=r):
            pltpu.make_async_copy(stage.at[r], _slab(out_hbm, 0, sub), sems.at[r]).wait()


def _scatter_add(grad, idx, num_weights: int, padding_idx: int, scale: bool,
                 tgt: tpu_info.Target):
    n, dim = grad.shape
    sub = slab_rows(grad.dtype)
    rows = rows_per_step(n, dim, grad.dtype)
    steps = pl.cdiv(n, rows)
    idx = jnp.clip(idx, 0, num_weights - 1)
    perm = jnp.argsort(idx, stable=True)
    # Sentinel -1 after the last key ends the final run and tile.
    key = jnp.pad(idx[perm], (0, steps * rows + 1 - n), constant_values=-1)
    g_sorted = pad_to(grad[perm], (steps * rows, dim))
    padded = round_up(num_weights, sub)
    zeros = jnp.zeros((padded, dim), grad.dtype)
    kernel = functools.partial(_scatter_kernel, rows=rows, sub=sub, n=n,
                               padding_idx=padding_idx, scale=scale)
    isz = grad.dtype.itemsize
    out = pallas_call(
        kernel,
        target=tgt,
        name="embedding_scatter_add",
        cost_estimate=cost(2 * n * sub * dim, 2 * n * dim * isz + n * sub * dim * isz),
        vmem_bytes=vmem_bytes(rows, dim, grad.dtype),
        dimension_semantics=("arbitrary",),
        out_shape=jax.ShapeDtypeStruct((padded, dim), grad.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(steps,),
            in_specs=[pl.BlockSpec((rows, dim), lambda i, key_ref: (i, 0)),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.VMEM((rows, sub, dim), grad.dtype),
                            pltpu.VMEM((sub, dim), jnp.float32),
                            pltpu.SMEM((1,), jnp.int32),
                            pltpu.SMEM((rows,), jnp.int32),
                            pltpu.SemaphoreType.DMA((rows,))]),
        input_output_aliases={2: 0},    # (key, grad, zeros): untouched tiles stay 0
    )(key, g_sorted, zeros)
    return out if padded == num_weights else out[:num_weights]


# ----------------------------------------------------------------------------- wrappers

def embedding_dense_backward(grad_output: jax.Array, indices: jax.Array, num_weights: int,
                             padding_idx: int = -1, scale_grad_by_freq: bool = False, *,
                             interpret: bool | None = None) -> jax.Array:
    """aten.embedding_dense_backward: grad rows [..., dim] summed into [num_weights, dim]
    by index; ``padding_idx`` (negative: none) gets zero grad; f32 accumulation."""
    dim = grad_output.shape[-1]
    tgt = tpu_info.target(interpret)
    _check((num_weights, dim), grad_output.dtype, indices, tgt.chip)
    return _scatter_add(grad_output.reshape(-1, dim), indices.reshape(-1).astype(jnp.int32),
                        int(num_weights), int(padding_idx) if padding_idx >= 0 else -1,
                        bool(scale_grad_by_freq), tgt)


def embedding(weight: jax.Array, indices: jax.Array, padding_idx: int = -1,
              scale_grad_by_freq: bool = False, *, interpret: bool | None = None) -> jax.Array:
    """aten.embedding: ``weight[indices]`` -> [*indices.shape, dim]. Differentiable in
    ``weight`` through :func:`embedding_dense_backward` (``padding_idx``/scaling apply
    there only, as in torch). Out-of-range indices are clipped (torch raises)."""
    tgt = tpu_info.target(interpret)
    _check(weight.shape, weight.dtype, indices, tgt.chip)
    idx = indices.reshape(-1).astype(jnp.int32)
    out = _lookup(weight, idx, weight.shape[0], int(padding_idx) if padding_idx >= 0 else -1,
                  bool(scale_grad_by_freq), tgt)
    return out.reshape(*indices.shape, weight.shape[1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _lookup(weight, idx, num_weights, padding_idx, scale, tgt):
    return _gather(weight, idx, tgt)


def _lookup_fwd(weight, idx, num_weights, padding_idx, scale, tgt):
    return _gather(weight, idx, tgt), idx


def _lookup_bwd(num_weights, padding_idx, scale, tgt, idx, g):
    return _scatter_add(g, idx, num_weights, padding_idx, scale, tgt), None


_lookup.defvjp(_lookup_fwd, _lookup_bwd)
