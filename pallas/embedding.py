"""Embedding lookup (row gather) and its dense backward (scatter-add) as Pallas kernels.

Forward: the flat indices are scalar-prefetched to SMEM; grid step i copies rows
idx[i*R .. i*R+R) of the HBM weight straight into the [R, dim] output block with one DMA per
row. (A data-dependent BlockSpec index_map cannot fetch a single row of a 2-D array: Mosaic
requires the block's second-minor dim to be a multiple of 8 or the whole dim, so the rows are
DMA'd by hand from the SMEM indices, as paged attention does with its page table.)

Backward (scatter-add with duplicates):
    perm = argsort(idx) (stable), key = idx[perm]          -- wrapper, 32-bit, to SMEM
    acc <- 0 (f32), cnt <- 0
    for p in 0..n-1 (grid steps of R sorted positions, "arbitrary": acc carries over):
        acc += grad[perm[p]]  (skipped when key[p] == padding_idx);  cnt += 1
        if key[p+1] != key[p]:  out[key[p]] = acc (/ cnt if scale_grad_by_freq); acc, cnt <- 0
Each weight row is written once, by a DMA from VMEM; rows never indexed keep the zeros the
output aliases.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info

_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
MAX_TOKENS = 32768          # indices (+ permutation) live in SMEM, about 1 MiB in all
_MAX_ROWS = 32              # rows (DMAs) per grid step; the per-row loop is unrolled
_STEP_BYTES = 512 * 1024    # aim for about this much row data per grid step


def _i32(v: int) -> jax.Array:
    # Static in-kernel offsets must be int32: under jax_enable_x64 a Python int lowers to i64.
    return jnp.int32(v)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def rows_per_step(n: int, dim: int, dtype) -> int:
    """Rows gathered/scattered per grid step: a multiple of the sublane tile, enough to move
    about ``_STEP_BYTES`` but no more than the (rounded-up) token count."""
    sub = tpu_info.sublane(dtype)
    by_bytes = _STEP_BYTES // max(1, dim * jnp.dtype(dtype).itemsize)
    rows = max(sub, min(_MAX_ROWS, by_bytes) // sub * sub)
    return min(rows, _round_up(n, sub))


def vmem_bytes(rows: int, dim: int, dtype) -> int:
    """Larger of forward (double-buffered [rows, dim] output) and backward (row buffer,
    flush staging buffer, f32 accumulator) VMEM use, padded to (sublane, 128) tiles."""
    tile = tpu_info.block_bytes((_round_up(rows, tpu_info.sublane(dtype)), _round_up(dim, 128)),
                                dtype)
    acc = tpu_info.block_bytes((8, _round_up(dim, 128)), jnp.float32)
    return max(2 * tile, 2 * tile + acc)


def supports(weight_shape: tuple[int, ...], weight_dtype, indices_shape: tuple[int, ...],
             indices_dtype, *, chip: tpu_info.Chip | None = None) -> str | None:
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
    chip = chip or tpu_info.current_chip()
    if vmem_bytes(rows_per_step(n, dim, weight_dtype), dim, weight_dtype) > tpu_info.vmem_budget(chip):
        return f"dim {dim} too wide for VMEM"
    return None


def _check(weight_shape, dtype, indices):
    reason = supports(weight_shape, dtype, indices.shape, indices.dtype)
    if reason:
        raise ValueError(f"embedding kernel: {reason}")


# ----------------------------------------------------------------------------- forward

def _gather_kernel(idx_ref, w_hbm, out_ref, sems, *, rows: int):
    base = pl.program_id(0) * rows
    copies = [pltpu.make_async_copy(w_hbm.at[pl.ds(idx_ref[base + r], 1)],
                                    out_ref.at[pl.ds(r, 1)], sems.at[_i32(r)]) for r in range(rows)]
    for c in copies:          # all row DMAs in flight before the first wait
        c.start()
    for c in copies:
        c.wait()


def _gather(weight, idx, interpret: bool):
    n, (num_weights, dim) = idx.shape[0], weight.shape
    rows = rows_per_step(n, dim, weight.dtype)
    steps = pl.cdiv(n, rows)
    # Pad to whole steps (rows past n land in the masked tail of the last block); clip so
    # a bad index cannot DMA outside the table.
    idx = jnp.pad(jnp.clip(idx, 0, num_weights - 1), (0, steps * rows - n))
    return pl.pallas_call(
        functools.partial(_gather_kernel, rows=rows),
        out_shape=jax.ShapeDtypeStruct((n, dim), weight.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(steps,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((rows, dim), lambda i, idx_ref: (i, 0)),
            scratch_shapes=[pltpu.SemaphoreType.DMA((rows,))]),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=interpret,
    )(idx, weight)


# ---------------------------------------------------------------------------- backward

def _scatter_kernel(key_ref, perm_ref, g_hbm, _zeros, out_hbm, buf, stage, acc, cnt, flushed,
                    in_sems, out_sems, *, rows: int, n: int, padding_idx: int, scale: bool):
    base = pl.program_id(0) * rows

    @pl.when(pl.program_id(0) == 0)
    def _init():
        acc[...] = jnp.zeros(acc.shape, jnp.float32)
        cnt[0] = 0

    loads = [pltpu.make_async_copy(g_hbm.at[pl.ds(perm_ref[base + r], 1)],
                                   buf.at[pl.ds(r, 1)], in_sems.at[_i32(r)]) for r in range(rows)]
    for c in loads:
        c.start()
    for c in loads:
        c.wait()

    for r in range(rows):     # sequential over sorted positions: runs of equal keys
        pos, flushed[r] = base + r, 0

        @pl.when(pos < n)
        def _accumulate(r=r, pos=pos):
            key = key_ref[pos]
            row = buf[pl.ds(r, 1), :].astype(jnp.float32)
            acc[...] += jnp.where(key == padding_idx, 0.0, row)
            cnt[0] += 1

            @pl.when(key_ref[pos + 1] != key)       # last of its run: write the row out
            def _flush():
                total = acc[...]
                if scale:
                    total = total / cnt[0].astype(jnp.float32)
                stage[pl.ds(r, 1), :] = total.astype(stage.dtype)
                pltpu.make_async_copy(stage.at[pl.ds(r, 1)], out_hbm.at[pl.ds(key, 1)],
                                      out_sems.at[_i32(r)]).start()
                flushed[r] = 1
                acc[...] = jnp.zeros(acc.shape, jnp.float32)
                cnt[0] = 0

    for r in range(rows):     # stage is reused next step: finish this step's writes
        @pl.when(flushed[r] == 1)
        def _wait(r=r):
            pltpu.make_async_copy(stage.at[pl.ds(r, 1)], out_hbm.at[pl.ds(0, 1)],
                                  out_sems.at[_i32(r)]).wait()


def _scatter_add(grad, idx, num_weights: int, padding_idx: int, scale: bool, interpret: bool):
    n, dim = grad.shape
    rows = rows_per_step(n, dim, grad.dtype)
    steps = pl.cdiv(n, rows)
    idx = jnp.clip(idx, 0, num_weights - 1)
    perm = jnp.argsort(idx, stable=True).astype(jnp.int32)
    # Sentinel -1 after the last key ends the final run; perm padding points at row 0.
    key = jnp.pad(idx[perm], (0, steps * rows + 1 - n), constant_values=-1)
    perm = jnp.pad(perm, (0, steps * rows - n))
    zeros = jnp.zeros((num_weights, dim), grad.dtype)
    kernel = functools.partial(_scatter_kernel, rows=rows, n=n, padding_idx=padding_idx,
                               scale=scale)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_weights, dim), grad.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(steps,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.VMEM((rows, dim), grad.dtype),
                            pltpu.VMEM((rows, dim), grad.dtype),
                            pltpu.VMEM((1, dim), jnp.float32),
                            pltpu.SMEM((1,), jnp.int32),
                            pltpu.SMEM((rows,), jnp.int32),
                            pltpu.SemaphoreType.DMA((rows,)),
                            pltpu.SemaphoreType.DMA((rows,))]),
        input_output_aliases={3: 0},    # (key, perm, grad, zeros): untouched rows stay 0
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
    )(key, perm, grad, zeros)


# ----------------------------------------------------------------------------- wrappers

def embedding_dense_backward(grad_output: jax.Array, indices: jax.Array, num_weights: int,
                             padding_idx: int = -1, scale_grad_by_freq: bool = False, *,
                             interpret: bool | None = None) -> jax.Array:
    """aten.embedding_dense_backward: grad rows [..., dim] summed into [num_weights, dim]
    by index; ``padding_idx`` (negative: none) gets zero grad; f32 accumulation."""
    dim = grad_output.shape[-1]
    _check((num_weights, dim), grad_output.dtype, indices)
    return _scatter_add(grad_output.reshape(-1, dim), indices.reshape(-1).astype(jnp.int32),
                        int(num_weights), int(padding_idx) if padding_idx >= 0 else -1,
                        bool(scale_grad_by_freq), tpu_info.resolve_interpret(interpret))


def embedding(weight: jax.Array, indices: jax.Array, padding_idx: int = -1,
              scale_grad_by_freq: bool = False, *, interpret: bool | None = None) -> jax.Array:
    """aten.embedding: ``weight[indices]`` -> [*indices.shape, dim]. Differentiable in
    ``weight`` through :func:`embedding_dense_backward` (``padding_idx``/scaling apply
    there only, as in torch). Out-of-range indices are clipped (torch raises)."""
    _check(weight.shape, weight.dtype, indices)
    interp = tpu_info.resolve_interpret(interpret)
    idx = indices.reshape(-1).astype(jnp.int32)
    out = _lookup(weight, idx, weight.shape[0], int(padding_idx) if padding_idx >= 0 else -1,
                  bool(scale_grad_by_freq), interp)
    return out.reshape(*indices.shape, weight.shape[1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _lookup(weight, idx, num_weights, padding_idx, scale, interpret):
    return _gather(weight, idx, interpret)


def _lookup_fwd(weight, idx, num_weights, padding_idx, scale, interpret):
    return _gather(weight, idx, interpret), idx


def _lookup_bwd(num_weights, padding_idx, scale, interpret, idx, g):
    return _scatter_add(g, idx, num_weights, padding_idx, scale, interpret), None


_lookup.defvjp(_lookup_fwd, _lookup_bwd)
