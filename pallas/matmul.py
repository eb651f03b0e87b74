"""Tiled matmul (mm / bmm / addmm) as a Pallas TPU kernel, with NN, NT and TN layouts.

Algorithm (one output tile per (i, j); k is the reduction axis, last in the grid):

    acc = 0                                   # f32, VMEM scratch
    for kk in range(cdiv(K, bk)):             # "arbitrary": sequential on a core
        acc += A[i, kk] @ B[kk, j]            # MXU, f32 accumulation; A read as [k, m]
                                              # (TN) or B as [n, k] (NT) by dot_general
    O[i, j] = beta * bias[i, j] + alpha * acc # epilogue on the last kk

Nothing is padded or transposed in HBM. The grid is cdiv(extent, block) per axis: edge
blocks of m and n read past the array and their extra rows/columns are dropped when the
output block is written; a ragged k is masked in the kernel on its last step (rows and
columns past k are zeroed in both operands: what lies past an array is undefined).
Blocks are chosen per (m, n, k, chip) by the modelled time of the grid they give: MXU
work of the blocks (edge blocks computed whole), HBM traffic with re-fetches, fixed
cost per step; a full-extent block (legal at any size) is a candidate on every axis.
"""
from __future__ import annotations

import functools
import itertools
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info, tuned
from tpu_kernels.pallas.launch import cost, pallas_call
from tpu_kernels.pallas.tpu_info import round_up

Blocks = tuple[int, int, int]   # (bm, bn, bk)

# Largest (bm, bn, bk) by MXU width and shape class; the modelled time picks below
# them. v6e/v7 need bm x bn of 1024 x 2048 for a square bf16 matmul to reach their
# ridge points (~560 and ~313 flop/byte); skinny-m (decode-like) problems spend VMEM
# on n and k.
_CAP: dict[tuple[int, str], Blocks] = {
    (128, "square"): (512, 1024, 512),
    (128, "skinny"): (128, 1024, 1024),
    (256, "square"): (1024, 2048, 1024),
    (256, "skinny"): (256, 2048, 1024),
}
_SUPPORTED = ("float32", "bfloat16")
# What the registry's cost model charges (registry/costs/kernel_model.py): a fixed cost
# per grid step, and six bf16 MXU passes for f32 operands at Precision.HIGHEST.
_STEP_SECONDS = 0.35e-6
_F32_PASSES = 6


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def vmem_bytes(blocks: Blocks, dtype, out_dtype=None, bias_bytes: int = 0) -> int:
    """VMEM the kernel holds: 2 buffers of each input/output block (in whole (sublane,
    128) tiles) + the f32 accumulator."""
    bm, bn, bk = blocks
    tile = tpu_info.tile_bytes
    # f32 operands at HIGHEST precision: Mosaic splits each block into bf16 parts in VMEM
    split = tile((bm, bk), dtype) + tile((bk, bn), dtype) if jnp.dtype(dtype) == jnp.float32 else 0
    return (2 * (tile((bm, bk), dtype) + tile((bk, bn), dtype)) + split
            + 2 * tile((bm, bn), out_dtype or dtype) + tile((bm, bn), jnp.float32)
            + 2 * bias_bytes)


def _candidates(d: int, align: int, cap: int) -> list[int]:
    """Block sizes for an axis of extent ``d``: the full extent (legal at any size) when
    it is at most twice the cap, and for each block count the smallest aligned block
    that covers ``d`` (the least padding for that count), down to cap / 8."""
    out = {d} if d <= 2 * cap else set()
    top = min(cap, round_up(d, align))
    floor = min(top, max(align, cap // 8))
    count = _cdiv(d, top)
    while True:
        b = round_up(_cdiv(d, count), align)
        if b < floor:
            break
        out.add(b)
        if b == floor:
            break
        count = _cdiv(d, b - align) if b > align else count + 1   # the next smaller block
    return sorted(out)


def modelled_seconds(m: int, n: int, k: int, blocks: Blocks, dtype, chip: tpu_info.Chip) -> float:
    """The grid's time on ``chip``: MXU work of whole blocks (edge blocks included, n and
    k rounded to the MXU width), HBM traffic with re-fetches, a cost per step, and the
    pipeline's exposed ends (the first blocks' fetch, the last output block's write)."""
    bm, bn, bk = blocks
    gm, gn, gk = _cdiv(m, bm), _cdiv(n, bn), _cdiv(k, bk)
    mxu, isz = chip.mxu, jnp.dtype(dtype).itemsize
    flops = 2 * gm * gn * gk * round_up(bm, tpu_info.sublane(dtype)) * round_up(bn, mxu) * round_up(bk, mxu)
    if jnp.dtype(dtype) == jnp.float32:
        flops *= _F32_PASSES
    traffic = (m * k * gn + k * n * gm + m * n) * isz
    exposed = (min(bm, m) * min(bk, k) + min(bk, k) * min(bn, n) + min(bm, m) * min(bn, n)) * isz
    return (max(flops / chip.bf16_flops, traffic / chip.hbm_bytes_per_s)
            + (gm * gn * gk * _STEP_SECONDS) + exposed / chip.hbm_bytes_per_s)


def least_time(candidates: Iterable[tuple], fits: Callable[[tuple], bool],
               seconds: Callable[[tuple], float]) -> tuple | None:
    """The first of ``candidates`` that ``fits`` with the least ``seconds``; None if none fits."""
    return min((b for b in candidates if fits(b)), key=seconds, default=None)


def choose_blocks(m: int, n: int, k: int, dtype, chip: tpu_info.Chip, *,
                  transpose_a: bool = False) -> Blocks:
    """The tuned table's entry for the problem's shape class (``tuned``, fitted to the
    problem), else the (bm, bn, bk) with the least modelled time among each axis's
    candidates that fit the VMEM budget. Caps come from the (MXU width, shape class)
    table; bm is a multiple of the sublane tile (of 128 when a is read as [k, m]), bn and
    bk of 128, or the full extent."""
    sub = 128 if transpose_a else tpu_info.sublane(dtype)
    hit = tuned.lookup_blocks("matmul", chip, dtype, align=(sub, 128, 128), m=m, n=n, k=k)
    if hit and vmem_bytes(hit, dtype) <= tuned.vmem_budget(chip, hit):
        return hit
    return _choose(m, n, k, jnp.dtype(dtype).name, chip, transpose_a)


@functools.lru_cache(maxsize=4096)
def _choose(m: int, n: int, k: int, dtype: str, chip: tpu_info.Chip, transpose_a: bool) -> Blocks:
    sub = tpu_info.sublane(dtype)
    cm, cn, ck = _CAP[(128 if chip.mxu <= 128 else 256, "skinny" if m <= 256 else "square")]
    budget = tpu_info.vmem_budget(chip)
    best = least_time(itertools.product(_candidates(m, 128 if transpose_a else sub, cm),
                                        _candidates(n, 128, cn), _candidates(k, 128, ck)),
                      lambda b: vmem_bytes(b, dtype) <= budget,
                      lambda b: modelled_seconds(m, n, k, b, dtype, chip))
    if best is None:      # nothing fits (a tiny budget): the smallest aligned blocks
        best = (min(m, 128 if transpose_a else sub), min(n, 128), min(k, 128))
    return best


def supports(a_shape, a_dtype, b_shape, b_dtype, bias_shape=None, bias_dtype=None, *,
             transpose_a: bool = False, transpose_b: bool = False) -> str | None:
    """None when the kernel handles these operands, else the reason it does not. a is
    [.., m, k] ([.., k, m] when transpose_a), b [.., k, n] ([.., n, k] when transpose_b)."""
    for name, dt in (("a", a_dtype), ("b", b_dtype)):
        if jnp.dtype(dt).name not in _SUPPORTED:
            return f"{jnp.dtype(dt).name} not supported (f32, bf16 only)"
    if jnp.dtype(a_dtype) != jnp.dtype(b_dtype):
        return "mixed input dtypes"
    if len(a_shape) != len(b_shape) or len(a_shape) not in (2, 3):
        return "operands must both be 2-D (mm) or both 3-D (bmm)"
    (m, ka), (kb, n) = _mk(a_shape, transpose_a), _mk(b_shape, transpose_b)
    if ka != kb or (len(a_shape) == 3 and a_shape[0] != b_shape[0]):
        return "shape mismatch"
    if 0 in tuple(a_shape) + tuple(b_shape):
        return "empty operand"
    if bias_shape is not None:
        if bias_dtype is not None and jnp.dtype(bias_dtype).name not in _SUPPORTED:
            return f"bias {jnp.dtype(bias_dtype).name} not supported"
        if len(a_shape) != 2:
            return "bias only with 2-D operands (addmm)"
        try:
            ok = len(bias_shape) <= 2 and jnp.broadcast_shapes(tuple(bias_shape), (m, n)) == (m, n)
        except ValueError:
            ok = False
        if not ok:
            return "bias not broadcastable to (m, n)"
    return None


def _mk(shape, transposed: bool) -> tuple[int, int]:
    """(rows, contracting) of an operand's last two dims as the product sees them."""
    r, c = shape[-2], shape[-1]
    return (c, r) if transposed else (r, c)


# --- kernel body ---------------------------------------------------------------------

def _mask_k(x, axis: int, kk, bk: int, k: int):
    """Zero the entries of ``x`` whose k index (along ``axis``) is past ``k``."""
    idx = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis) + kk * bk
    return jnp.where(idx < k, x, jnp.zeros_like(x))


def _kernel(*refs, precision, alpha, beta, has_bias, transpose_a, transpose_b, k, bk, upcast):
    if has_bias:
        a_ref, b_ref, bias_ref, o_ref, acc_ref = refs
    else:
        (a_ref, b_ref, o_ref, acc_ref), bias_ref = refs, None
    kk, last = pl.program_id(3), pl.num_programs(3) - 1
    a_k, b_k = (0 if transpose_a else 1), (1 if transpose_b else 0)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def accumulate(ragged: bool):
        a, b = a_ref[...], b_ref[...]
        if ragged:
            a, b = _mask_k(a, a_k, kk, bk, k), _mask_k(b, b_k, kk, bk, k)
        if upcast:    # interpret mode: XLA's CPU dot has no bf16 x bf16 -> f32 once a transpose
            a, b = a.astype(jnp.float32), b.astype(jnp.float32)    # folds into it; exact products
        acc_ref[...] += jax.lax.dot_general(a, b, (((a_k,), (b_k,)), ((), ())),
                                            precision=precision,
                                            preferred_element_type=jnp.float32)

    if k % bk:            # only the last k step reaches past k
        pl.when(kk < last)(lambda: accumulate(False))
        pl.when(kk == last)(lambda: accumulate(True))
    else:
        accumulate(False)

    @pl.when(kk == last)
    def _store():
        out = acc_ref[...]
        if alpha != 1.0:
            out = out * alpha
        if bias_ref is not None:
            out = out + beta * bias_ref[...].astype(jnp.float32)
        o_ref[...] = out.astype(o_ref.dtype)


# --- BlockSpecs, grid and wrapper ----------------------------------------------------

def _bias_2d(bias: jax.Array) -> jax.Array:
    """Bias as a 2-D (1|m, 1|n) array: broadcast dims stay 1 and are not materialised."""
    return bias.reshape((1,) * (2 - bias.ndim) + bias.shape)


def _cost(nb: int, m: int, n: int, k: int, blocks: Blocks, dtype, bias_bytes: int):
    """FLOPs of whole blocks (edge blocks included); HBM traffic: A is re-read for every
    column block, B for every row block (edge blocks move only what is in the array)."""
    bm, bn, bk = blocks
    gm, gn, gk = _cdiv(m, bm), _cdiv(n, bn), _cdiv(k, bk)
    isz = jnp.dtype(dtype).itemsize
    traffic = nb * (m * k * gn + k * n * gm + m * n) * isz + bias_bytes
    return cost(2 * nb * gm * bm * gn * bn * gk * bk, traffic)


def _tiled(a, b, bias, *, blocks, precision, alpha, beta, transpose_a, transpose_b, target):
    """a [B, m, k] ([B, k, m]) @ b [B, k, n] ([B, n, k]) (+ 2-D bias), unpadded."""
    nb = a.shape[0]
    m, k = _mk(a.shape, transpose_a)
    n = _mk(b.shape, not transpose_b)[0]
    bm, bn, bk = blocks
    grid = (nb, _cdiv(m, bm), _cdiv(n, bn), _cdiv(k, bk))
    a_spec = (pl.BlockSpec((None, bk, bm), lambda g, i, j, kk: (g, kk, i)) if transpose_a
              else pl.BlockSpec((None, bm, bk), lambda g, i, j, kk: (g, i, kk)))
    b_spec = (pl.BlockSpec((None, bn, bk), lambda g, i, j, kk: (g, j, kk)) if transpose_b
              else pl.BlockSpec((None, bk, bn), lambda g, i, j, kk: (g, kk, j)))
    in_specs, operands, bias_block = [a_spec, b_spec], [a, b], 0
    if bias is not None:
        rows, cols = bias.shape
        block = (bm if rows > 1 else 1, bn if cols > 1 else 1)
        in_specs.append(pl.BlockSpec(
            block, lambda g, i, j, kk: (i if rows > 1 else 0, j if cols > 1 else 0)))
        operands.append(bias)
        bias_block = tpu_info.tile_bytes(block, bias.dtype)
    kernel = functools.partial(_kernel, precision=precision, alpha=alpha, beta=beta,
                               has_bias=bias is not None, transpose_a=transpose_a,
                               transpose_b=transpose_b, k=k, bk=bk,
                               upcast=target.interpret and a.dtype == jnp.bfloat16)
    return pallas_call(
        kernel,
        target=target,
        name="matmul",
        cost_estimate=_cost(nb, m, n, k, blocks, a.dtype, 0 if bias is None else bias.nbytes),
        vmem_bytes=vmem_bytes(blocks, a.dtype, bias_bytes=bias_block),
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
        out_shape=jax.ShapeDtypeStruct((nb, m, n), a.dtype),
        grid=grid,
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, bm, bn), lambda g, i, j, kk: (g, i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )(*operands)


def _resolve_precision(dtype, precision):
    """f32 defaults to HIGHEST (torch's fp32 matmul is full precision); bf16 is exact."""
    if jnp.dtype(dtype) == jnp.float32:
        return jax.lax.Precision.HIGHEST if precision is None else precision
    return jax.lax.Precision.DEFAULT


def _forward(a, b, bias, opts):
    """Choose blocks and run the kernel. ``opts`` = (precision, block, target, alpha,
    beta, transpose_a, transpose_b), hashable so it can be a custom_vjp static argument."""
    precision, block, target, alpha, beta, ta, tb = opts
    m, k = _mk(a.shape, ta)
    n = _mk(b.shape, not tb)[0]
    blocks = block or choose_blocks(m, n, k, a.dtype, target.chip, transpose_a=ta)
    return _tiled(a, b, None if bias is None else _bias_2d(bias), blocks=tuple(blocks),
                  precision=_resolve_precision(a.dtype, precision), alpha=alpha, beta=beta,
                  transpose_a=ta, transpose_b=tb, target=target)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _mm(a, b, bias, opts):
    return _forward(a, b, bias, opts)


def _mm_fwd(a, b, bias, opts):
    return _forward(a, b, bias, opts), (a, b, bias)


def _mm_bwd(opts, res, g):
    """C = A B with A = a or a^T, B = b or b^T: dA = alpha g B^T, dB = alpha A^T g, each
    written in its operand's stored layout by the NN/NT/TN kernel reading a, b and g where
    they lie (no transpose in HBM); dbias = beta sum(g)."""
    a, b, bias = res
    precision, _, target, alpha, beta, ta, tb = opts

    def run(x, y, tx, ty):
        return _forward(x, y, None, (precision, None, target, alpha, 1.0, tx, ty))

    g = g.astype(a.dtype)
    da = run(b, g, tb, True) if ta else run(g, b, False, not tb)     # [k, m] or [m, k]
    db = run(g, a, True, ta) if tb else run(a, g, not ta, False)     # [n, k] or [k, n]
    dbias = None
    if bias is not None:
        gb = beta * g.astype(jnp.float32).sum(0)                 # (m, n)
        b2 = _bias_2d(bias).shape
        gb = gb.sum(axis=[d for d in (0, 1) if b2[d] == 1], keepdims=True)
        dbias = gb.reshape(bias.shape).astype(bias.dtype)
    return da, db, dbias


_mm.defvjp(_mm_fwd, _mm_bwd)


def _check(a, b, bias, ta, tb):
    reason = supports(a.shape, a.dtype, b.shape, b.dtype,
                      None if bias is None else bias.shape,
                      None if bias is None else bias.dtype, transpose_a=ta, transpose_b=tb)
    if reason:
        raise ValueError(f"pallas matmul: {reason} (a {a.shape} {a.dtype}, b {b.shape} "
                         f"{b.dtype}); use jnp.matmul for these operands")


def matmul(a: jax.Array, b: jax.Array, bias: jax.Array | None = None, *,
           beta: float = 1.0, alpha: float = 1.0,
           precision: jax.lax.Precision | None = None, block: Blocks | None = None,
           transpose_a: bool = False, transpose_b: bool = False,
           interpret: bool | None = None) -> jax.Array:
    """``beta * bias + alpha * (A @ B)`` for A = a [m, k] (a^T for a [k, m] when
    transpose_a), B = b [k, n] (b^T for b [n, k] when transpose_b); bias broadcastable
    to (m, n) (aten.mm / aten.addmm). f32 uses ``precision`` (default HIGHEST).
    Differentiable (custom_vjp; the backward reuses this kernel, NT/TN)."""
    _check(a, b, bias, transpose_a, transpose_b)
    if a.ndim != 2:
        raise ValueError(f"pallas matmul takes 2-D operands, got a {a.shape}; use bmm for 3-D")
    opts = (precision, block, tpu_info.target(interpret), float(alpha), float(beta),
            bool(transpose_a), bool(transpose_b))
    return _mm(a[None], b[None], bias, opts)[0]


def bmm(a: jax.Array, b: jax.Array, *, precision: jax.lax.Precision | None = None,
        block: Blocks | None = None, transpose_a: bool = False, transpose_b: bool = False,
        interpret: bool | None = None) -> jax.Array:
    """Batched ``A @ B`` for a [B, m, k] ([B, k, m] when transpose_a), b [B, k, n]
    ([B, n, k] when transpose_b) (aten.bmm); the batch is a grid axis."""
    _check(a, b, None, transpose_a, transpose_b)
    if a.ndim != 3:
        raise ValueError(f"pallas bmm takes 3-D operands, got a {a.shape}")
    return _mm(a, b, None, (precision, block, tpu_info.target(interpret), 1.0, 1.0,
                            bool(transpose_a), bool(transpose_b)))
