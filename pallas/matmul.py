"""Tiled matmul (mm / bmm / addmm) as a Pallas TPU kernel.

Algorithm (one output tile per (i, j); k is the reduction axis, last in the grid):

    acc = 0                                   # f32, VMEM scratch
    for kk in range(K / bk):                  # "arbitrary": sequential on a core
        acc += A[i, kk] @ B[kk, j]            # MXU, f32 accumulation
    O[i, j] = beta * bias[i, j] + alpha * acc # epilogue on the last kk

The wrapper zero-pads m, n, k up to block multiples (zeros leave the sum unchanged) and
slices the result back, so no shape is refused. Block sizes come from a per-MXU-width
table, clamped to the problem and shrunk until the double-buffered blocks plus the
accumulator fit the chip's VMEM budget.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info, tuned
from tpu_kernels.pallas.launch import cost, pad_to, pallas_call
from tpu_kernels.pallas.tpu_info import round_up

Blocks = tuple[int, int, int]   # (bm, bn, bk)

# Preferred (bm, bn, bk) by MXU width and shape class. 256-wide MXUs (v6e, v7) want
# multiples of 256 on n and k; skinny-m (decode-like) problems spend VMEM on n and k.
_TABLE: dict[tuple[int, str], Blocks] = {
    (128, "square"): (512, 512, 512),
    (128, "skinny"): (128, 1024, 1024),
    (256, "square"): (512, 1024, 1024),
    (256, "skinny"): (256, 2048, 1024),
}
_SUPPORTED = ("float32", "bfloat16")


def vmem_bytes(blocks: Blocks, dtype, out_dtype=None, bias_bytes: int = 0) -> int:
    """VMEM the kernel holds: 2 buffers of each input/output block + f32 accumulator."""
    bm, bn, bk = blocks
    isz = jnp.dtype(dtype).itemsize
    osz = jnp.dtype(out_dtype or dtype).itemsize
    return 2 * (bm * bk + bk * bn) * isz + 2 * bm * bn * osz + bm * bn * 4 + 2 * bias_bytes


def choose_blocks(m: int, n: int, k: int, dtype, chip: tpu_info.Chip) -> Blocks:
    """The tuned table's entry (``tuned``), else the heuristic's for (chip.mxu, shape
    class), clamped to the padded problem, then halved (largest first, never below
    (sublane, 128, 128)) until it fits VMEM."""
    sub = tpu_info.sublane(dtype)
    shape_class = "skinny" if m <= 256 else "square"
    hit = tuned.lookup_blocks("matmul", chip, dtype, align=(sub, 128, 128), m=m, n=n, k=k)
    bm, bn, bk = hit or _TABLE[(128 if chip.mxu <= 128 else 256, shape_class)]
    bm = min(bm, round_up(m, sub))
    bn = min(bn, round_up(n, 128))
    bk = min(bk, round_up(k, 128))
    budget = tuned.vmem_budget(chip, hit)
    while vmem_bytes((bm, bn, bk), dtype) > budget:
        if bk >= max(bn, bm) and bk > 128:
            bk //= 2
        elif bn >= bm and bn > 128:
            bn //= 2
        elif bm > sub:
            bm = max(sub, bm // 2)
        else:
            break
    return bm, bn, bk


def supports(a_shape, a_dtype, b_shape, b_dtype, bias_shape=None, bias_dtype=None) -> str | None:
    """None when the kernel handles these operands, else the reason it does not."""
    for name, dt in (("a", a_dtype), ("b", b_dtype)):
        if jnp.dtype(dt).name not in _SUPPORTED:
            return f"{jnp.dtype(dt).name} not supported (f32, bf16 only)"
    if jnp.dtype(a_dtype) != jnp.dtype(b_dtype):
        return "mixed input dtypes"
    if len(a_shape) != len(b_shape) or len(a_shape) not in (2, 3):
        return "operands must both be 2-D (mm) or both 3-D (bmm)"
    if a_shape[-1] != b_shape[-2] or (len(a_shape) == 3 and a_shape[0] != b_shape[0]):
        return "shape mismatch"
    if 0 in tuple(a_shape) + tuple(b_shape):
        return "empty operand"
    if bias_shape is not None:
        if bias_dtype is not None and jnp.dtype(bias_dtype).name not in _SUPPORTED:
            return f"bias {jnp.dtype(bias_dtype).name} not supported"
        if len(a_shape) != 2:
            return "bias only with 2-D operands (addmm)"
        mn = (a_shape[0], b_shape[1])
        try:
            ok = len(bias_shape) <= 2 and jnp.broadcast_shapes(tuple(bias_shape), mn) == mn
        except ValueError:
            ok = False
        if not ok:
            return "bias not broadcastable to (m, n)"
    return None


# --- kernel body ---------------------------------------------------------------------

def _kernel(*refs, precision, alpha, beta, has_bias):
    if has_bias:
        a_ref, b_ref, bias_ref, o_ref, acc_ref = refs
    else:
        (a_ref, b_ref, o_ref, acc_ref), bias_ref = refs, None
    kk = pl.program_id(3)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], precision=precision,
                            preferred_element_type=jnp.float32)

    @pl.when(kk == pl.num_programs(3) - 1)
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
    """FLOPs and HBM traffic: A is re-read for every column block, B for every row block."""
    bm, bn, _ = blocks
    isz = jnp.dtype(dtype).itemsize
    traffic = nb * (m * k * (n // bn) + k * n * (m // bm) + m * n) * isz + bias_bytes
    return cost(2 * nb * m * n * k, traffic)


def _tiled(a, b, bias, *, blocks, precision, alpha, beta, target):
    """a [B, m, k] @ b [B, k, n] (+ 2-D bias), all already padded to block multiples."""
    nb, m, k = a.shape
    n = b.shape[2]
    bm, bn, bk = blocks
    grid = (nb, m // bm, n // bn, k // bk)
    in_specs = [pl.BlockSpec((None, bm, bk), lambda g, i, j, kk: (g, i, kk)),
                pl.BlockSpec((None, bk, bn), lambda g, i, j, kk: (g, kk, j))]
    operands = [a, b]
    bias_block = 0
    if bias is not None:
        rows, cols = bias.shape
        block = (bm if rows > 1 else 1, bn if cols > 1 else 1)
        in_specs.append(pl.BlockSpec(
            block, lambda g, i, j, kk: (i if rows > 1 else 0, j if cols > 1 else 0)))
        operands.append(bias)
        bias_block = tpu_info.tile_bytes(block, bias.dtype)
    kernel = functools.partial(_kernel, precision=precision, alpha=alpha, beta=beta,
                               has_bias=bias is not None)
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
    """Pad, run the tiled kernel, slice back. ``opts`` = (precision, block, target,
    alpha, beta), hashable so it can be a custom_vjp static argument."""
    precision, block, target, alpha, beta = opts
    nb, m, k = a.shape
    n = b.shape[2]
    bm, bn, bk = block or choose_blocks(m, n, k, a.dtype, target.chip)
    mp, np_, kp = round_up(m, bm), round_up(n, bn), round_up(k, bk)
    a = pad_to(a, (nb, mp, kp))
    b = pad_to(b, (nb, kp, np_))
    if bias is not None:
        bias = _bias_2d(bias)
        bias = pad_to(bias, (mp if bias.shape[0] > 1 else 1, np_ if bias.shape[1] > 1 else 1))
    out = _tiled(a, b, bias, blocks=(bm, bn, bk),
                 precision=_resolve_precision(a.dtype, precision), alpha=alpha, beta=beta,
                 target=target)
    return out[:, :m, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _mm(a, b, bias, opts):
    return _forward(a, b, bias, opts)


def _mm_fwd(a, b, bias, opts):
    return _forward(a, b, bias, opts), (a, b, bias)


def _mm_bwd(opts, res, g):
    """dA = alpha g B^T, dB = alpha A^T g (same kernel, fresh blocks), dbias = beta sum(g)."""
    a, b, bias = res
    precision, _, target, alpha, beta = opts
    bopts = (precision, None, target, alpha, 1.0)
    g = g.astype(a.dtype)
    da = _forward(g, jnp.swapaxes(b, 1, 2), None, bopts)
    db = _forward(jnp.swapaxes(a, 1, 2), g, None, bopts)
    dbias = None
    if bias is not None:
        gb = beta * g.astype(jnp.float32).sum(0)                 # (m, n)
        b2 = _bias_2d(bias).shape
        gb = gb.sum(axis=[d for d in (0, 1) if b2[d] == 1], keepdims=True)
        dbias = gb.reshape(bias.shape).astype(bias.dtype)
    return da, db, dbias


_mm.defvjp(_mm_fwd, _mm_bwd)


def _check(a, b, bias):
    reason = supports(a.shape, a.dtype, b.shape, b.dtype,
                      None if bias is None else bias.shape,
                      None if bias is None else bias.dtype)
    if reason:
        raise ValueError(f"pallas matmul: {reason}")


def matmul(a: jax.Array, b: jax.Array, bias: jax.Array | None = None, *,
           beta: float = 1.0, alpha: float = 1.0,
           precision: jax.lax.Precision | None = None, block: Blocks | None = None,
           interpret: bool | None = None) -> jax.Array:
    """``beta * bias + alpha * (a @ b)`` for a [m, k], b [k, n]; bias broadcastable to
    (m, n) (aten.mm / aten.addmm). f32 uses ``precision`` (default HIGHEST).
    Differentiable (custom_vjp; the backward reuses this kernel)."""
    _check(a, b, bias)
    if a.ndim != 2:
        raise ValueError("matmul takes 2-D operands; use bmm for 3-D")
    opts = (precision, block, tpu_info.target(interpret), float(alpha), float(beta))
    return _mm(a[None], b[None], bias, opts)[0]


def bmm(a: jax.Array, b: jax.Array, *, precision: jax.lax.Precision | None = None,
        block: Blocks | None = None, interpret: bool | None = None) -> jax.Array:
    """Batched ``a @ b`` for a [B, m, k], b [B, k, n] (aten.bmm); the batch is a grid axis."""
    _check(a, b, None)
    if a.ndim != 3:
        raise ValueError("bmm takes 3-D operands")
    return _mm(a, b, None, (precision, block, tpu_info.target(interpret), 1.0, 1.0))
