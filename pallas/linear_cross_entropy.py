"""Fused linear + cross entropy: loss of (hidden [n, h] @ weight[V, h]^T) without the [n, V]
logits in HBM.

Forward, one Pallas kernel, grid (row blocks "parallel", vocab blocks, hidden blocks):
    acc = sum_k H[i, k] W[j, k]^T                (f32 VMEM scratch, logits block stays in VMEM)
    on the last k: online max / sum-exp / target logit / logit sum over vocab block j
    lse = m + log s;  loss = lse - (1 - eps) x_t - eps / V sum_c x_c   (0 on ignored rows)
  The hidden dim is one block whenever it fits, so H[i] stays in VMEM across the vocab axis
  and is read once; W is read once per row block. A step then does 2 bn bv h flops for
  bv h bytes of W: intensity ~bn flop/byte (bf16), and bn is picked per chip to clear the
  chip's ridge point (peak flops / HBM bandwidth).
Backward, over vocab chunks [c0, c0 + chunk) (multiples of the vocab block; the last one
shorter), one Pallas kernel per chunk, grid (vocab blocks "parallel", row blocks
"arbitrary"):
    G = g [(1 - eps)(softmax - onehot_t) + eps / V (V softmax - 1)]   (logits recomputed
        in VMEM; written once, in the input dtype, for dH)
    dW[c0 + j] = sum_i G_ij^T H_i     (f32 VMEM accumulator, W[j] resident: ~2 bv flop/byte)
    dH += G W[c0:c0+chunk]           (one XLA dot per chunk, f32 carry)
  Why dH goes through HBM and not a second in-kernel pass: accumulating dH in VMEM as well
  needs the logits recomputed once more (2 n V h flops), which costs more than writing G
  once and reading it once (4 n V bytes in bf16) whenever h > 2 x ridge (flop/byte): 480 on
  v5e, 1120 on v6e, 626 on v7x -- below any LLM hidden size.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.cross_entropy import online_lse_step
from tpu_kernels.pallas.launch import cost, pallas_call
from tpu_kernels.pallas.tpu_info import round_up

REDUCTIONS = ("mean", "sum", "none")
_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
# Whole hidden rows live in VMEM (forward: H[i]; backward: H[i], W[j] and dW[j] in f32):
# 8192 fits every checked chip (test_blocks_fit_vmem).
MAX_HIDDEN = 8192
_VOCAB_BLOCK = 512
_BWD_VOCAB_BLOCKS = (128, 256, 512, 1024)
_BWD_ROW_BLOCK = 256
# Blocks must clear the ridge point by this factor: the per-step fixed cost and DMA waits.
_RIDGE_MARGIN = 1.15
_CHUNK_BYTES = 256 * 1024 * 1024        # the [n, chunk] grad-logits temporary per chunk


def vmem_budget(chip: tpu_info.Chip) -> int:
    """Half the physical VMEM: the kernels raise their scoped limit to it (``launch``
    allows up to 3/4 with headroom), the rest stays with XLA's fusions."""
    return chip.vmem_bytes // 2


def _ridge(chip: tpu_info.Chip) -> float:
    """Flops per HBM byte at which the chip turns compute-bound."""
    return chip.bf16_flops / chip.hbm_bytes_per_s


def vmem_bytes(block_n: int, block_v: int, h: int, dtype) -> int:
    """Forward: double-buffered H[i] (whole rows) and W[j] blocks, the f32 logits block and
    ~3 f32 temporaries of it, small per-row blocks."""
    tile = lambda r, c, dt: tpu_info.tile_bytes((r, c), dt)  # noqa: E731
    ins = 2 * (tile(block_n, h, dtype) + tile(block_v, h, dtype))
    rows = 2 * 3 * tile(block_n, 4, jnp.float32) + 4 * tile(block_n, 1, jnp.float32)
    return ins + 4 * tile(block_n, block_v, jnp.float32) + rows


def bwd_vmem_bytes(block_n: int, block_v: int, h: int, dtype) -> int:
    """Backward: double-buffered H[i], W[j], the dW[j] output and the G block; the f32 dW
    accumulator and the f32 product added to it; the f32 logits block and ~3 temporaries."""
    tile = lambda r, c, dt: tpu_info.tile_bytes((r, c), dt)  # noqa: E731
    f32 = jnp.float32
    ins = 2 * (tile(block_n, h, dtype) + 2 * tile(block_v, h, dtype) + tile(block_n, block_v, dtype))
    rows = 2 * 5 * tile(block_n, 4, f32)
    return ins + 2 * tile(block_v, h, f32) + 4 * tile(block_n, block_v, f32) + rows


def block_sizes(n: int, h: int, vocab: int, dtype, chip: tpu_info.Chip) -> tuple[int, int]:
    """Forward (rows, vocab) blocks. With H[i] resident a step's intensity is ~2 bn / itemsize
    flop/byte, so bn is the smallest MXU multiple clearing the chip's ridge point (capped
    by n); then bv, then bn, shrink until the blocks fit ``vmem_budget``."""
    sub, isz = tpu_info.sublane(dtype), jnp.dtype(dtype).itemsize
    want = round_up(math.ceil(_ridge(chip) * _RIDGE_MARGIN * isz / 2), chip.mxu)
    bn = min(want, round_up(n, sub))
    bv = min(_VOCAB_BLOCK, round_up(vocab, 128))
    budget = vmem_budget(chip)
    return _shrink(bn, bv, sub, lambda bn, bv: vmem_bytes(bn, bv, h, dtype) <= budget)


def bwd_block_sizes(n: int, h: int, chunk: int, dtype, chip: tpu_info.Chip) -> tuple[int, int]:
    """Backward (rows, vocab) blocks. W[j] stays resident while row blocks stream: a step
    does 4 bn bv h flops for (bn h + bn bv) x itemsize bytes, so bv is the smallest that
    clears the ridge point; then bv, then bn, shrink until the blocks fit."""
    sub, isz = tpu_info.sublane(dtype), jnp.dtype(dtype).itemsize
    need = _ridge(chip) * _RIDGE_MARGIN
    cap = round_up(chunk, 128)
    bv = next((b for b in _BWD_VOCAB_BLOCKS if 4 * b * h / (isz * (h + b)) >= need),
              _BWD_VOCAB_BLOCKS[-1])
    bv, bn = min(bv, cap), min(_BWD_ROW_BLOCK, round_up(n, sub))
    budget = vmem_budget(chip)
    return _shrink(bn, bv, sub, lambda bn, bv: bwd_vmem_bytes(bn, bv, h, dtype) <= budget)


def _shrink(bn: int, bv: int, sub: int, fits) -> tuple[int, int]:
    """Halve bv (down to 128), then bn (down to the sublane tile), until ``fits(bn, bv)``."""
    while not fits(bn, bv) and bv > 128:
        bv //= 2
    while not fits(bn, bv) and bn > sub:
        bn = max(sub, round_up(bn // 2, sub))
    return bn, bv


def default_chunk(n: int, vocab: int, dtype=jnp.bfloat16) -> int:
    """Vocab columns per backward chunk: the [n, chunk] grad-logits temporary (input dtype)
    stays near ``_CHUNK_BYTES``; a multiple of 1024 columns, never more than the vocabulary."""
    per_col = max(n, 1) * jnp.dtype(dtype).itemsize
    chunk = max(1024, _CHUNK_BYTES // per_col // 1024 * 1024)
    return min(chunk, vocab)


def peak_logits_bytes(n: int, h: int, vocab: int, chunk: int | None = None,
                      dtype=jnp.bfloat16) -> dict[str, int]:
    """Analytic count (not measured) of the big temporaries of one forward+backward.
    Unfused linear + cross_entropy: at least the f32 logits [n, V] and their f32 grad [n, V]
    (a lower bound; see ``measured_unfused_temp_bytes``). Fused: the grad chunk [n, chunk]
    in the input dtype, the f32 dH carry [n, h] and the f32 dH term of one chunk."""
    chunk = chunk or default_chunk(n, vocab, dtype)
    unfused = 2 * n * vocab * 4
    fused = n * chunk * jnp.dtype(dtype).itemsize + 2 * n * h * 4
    return {"unfused": unfused, "fused": fused, "saved": unfused - fused}


def measured_unfused_temp_bytes(n: int, h: int, vocab: int, dtype=jnp.bfloat16) -> int | None:
    """XLA's temp allocation (``compile().memory_analysis()``, on the current backend) for
    value_and_grad of the plain linear + cross_entropy reference; None if unavailable."""
    from tpu_kernels.pallas.reference.linear_cross_entropy import linear_cross_entropy as ref

    def loss_and_grads(hid, w, t):
        loss = lambda hid, w: ref(hid, w, t).astype(jnp.float32)  # noqa: E731
        return jax.value_and_grad(loss, argnums=(0, 1))(hid, w)

    args = (jax.ShapeDtypeStruct((n, h), dtype), jax.ShapeDtypeStruct((vocab, h), dtype),
            jax.ShapeDtypeStruct((n,), jnp.int32))
    stats = jax.jit(loss_and_grads).lower(*args).compile().memory_analysis()
    return None if stats is None else int(stats.temp_size_in_bytes)


def supports(hidden_shape: tuple[int, ...], weight_shape: tuple[int, ...], dtype,
             target_dtype, *, reduction: str = "mean",
             label_smoothing: float = 0.0) -> str | None:
    """None when the kernel handles these arguments, else the reason it does not."""
    if len(hidden_shape) != 2 or len(weight_shape) != 2:
        return "hidden must be [n, h] and weight [vocab, h]"
    (n, h), (vocab, h2) = hidden_shape, weight_shape
    if h != h2:
        return f"hidden size {h} != weight's {h2}"
    if jnp.dtype(dtype) not in _DTYPES:
        return f"dtype {jnp.dtype(dtype)} not in float32/bfloat16"
    if not jnp.issubdtype(jnp.dtype(target_dtype), jnp.integer):
        return "targets must be class indices (integer)"
    if n == 0 or vocab == 0 or h == 0:
        return "empty hidden or weight"
    if vocab >= 2**31 or n >= 2**31:
        return "rows or vocab >= 2**31 do not fit int32 indices"
    if h > MAX_HIDDEN:
        return f"hidden size {h} > {MAX_HIDDEN} (whole hidden rows must fit VMEM)"
    if reduction not in REDUCTIONS:
        return f"reduction {reduction!r} not in {REDUCTIONS}"
    if not 0.0 <= label_smoothing <= 1.0:
        return "label_smoothing must be in [0, 1]"
    return None


# The kernels' dots take one MXU pass whatever the dtype (named: the lowering context's
# default is torch's float32 precision). HIGHEST on float32 blocks (tpu_info.mxu_precision)
# needs 81 MiB of scoped VMEM on v5e at production shapes (limit 61): float32 inputs keep
# bfloat16-pass logits here until the blocks are sized for it.
_IN_KERNEL = lax.Precision.DEFAULT


def _logits(h_ref, w_ref):
    """H_i W_j^T in f32 on the MXU (an NT dot_general: no transpose materialised)."""
    return lax.dot_general(h_ref[...], w_ref[...], (((1,), (1,)), ((), ())), precision=_IN_KERNEL,
                           preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------- forward

def _fwd_kernel(h_ref, w_ref, t_ref, out_ref, m_sc, s_sc, xt_sc, sx_sc, *,
                vocab: int, block_v: int):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        for r in (s_sc, xt_sc, sx_sc):
            r[...] = jnp.zeros(r.shape, jnp.float32)

    x, valid = online_lse_step(_logits(h_ref, w_ref), j, block_v, vocab, t_ref, m_sc, s_sc,
                               xt_sc)
    sx_sc[...] += jnp.where(valid, x, 0.0).sum(axis=1, keepdims=True)

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        out_ref[:, 0:1] = m_sc[...] + jnp.log(s_sc[...])
        out_ref[:, 1:2] = xt_sc[...]
        out_ref[:, 2:3] = sx_sc[...]


def _fwd_cost(n: int, h: int, vocab: int, blocks, dtype):
    """The logits matmul over the padded grid and an exp per logit; HBM: H once (resident
    across the vocab axis), W once per row block."""
    bn, bv = blocks
    isz = jnp.dtype(dtype).itemsize
    rn, rv = pl.cdiv(n, bn), pl.cdiv(vocab, bv)
    traffic = (n * h + rn * vocab * h) * isz
    return cost(2 * rn * bn * rv * bv * h + 6 * n * vocab, traffic, n * vocab)


def _row_stats(hidden, weight, target, tgt: tpu_info.Target):
    """Per-row (lse, x_target, sum_c x_c), f32 [n, 3]."""
    (n, h), vocab = hidden.shape, weight.shape[0]
    bn, bv = blocks = block_sizes(n, h, vocab, hidden.dtype, tgt.chip)
    return pallas_call(
        functools.partial(_fwd_kernel, vocab=vocab, block_v=bv),
        target=tgt,
        name="linear_cross_entropy_fwd",
        cost_estimate=_fwd_cost(n, h, vocab, blocks, hidden.dtype),
        vmem_bytes=vmem_bytes(bn, bv, h, hidden.dtype),
        dimension_semantics=("parallel", "arbitrary"),
        out_shape=jax.ShapeDtypeStruct((n, 3), jnp.float32),
        grid=(pl.cdiv(n, bn), pl.cdiv(vocab, bv)),
        in_specs=[pl.BlockSpec((bn, h), lambda i, j: (i, 0)),
                  pl.BlockSpec((bv, h), lambda i, j: (j, 0)),
                  pl.BlockSpec((bn, 1), lambda i, j: (i, 0))],
        out_specs=pl.BlockSpec((bn, 3), lambda i, j: (i, 0)),
        scratch_shapes=[pltpu.VMEM((bn, 1), jnp.float32) for _ in range(4)],
    )(hidden, weight, target[:, None])


# ---------------------------------------------------------------------------- backward

def _bwd_kernel(off_ref, h_ref, w_ref, t_ref, coef_ref, *refs, n: int, size: int,
                block_n: int, block_v: int, aliased: bool):
    g_ref, dw_ref, acc = refs[1:] if aliased else refs     # refs[0]: dW so far (aliased)
    # Grid indices are read here, not inside pl.when bodies (interpret mode cannot).
    j, i, last_i = pl.program_id(0), pl.program_id(1), pl.num_programs(1) - 1
    x = _logits(h_ref, w_ref)
    local = j * block_v + lax.broadcasted_iota(jnp.int32, x.shape, 1)
    rows = i * block_n + lax.broadcasted_iota(jnp.int32, (x.shape[0], 1), 0)
    keep = (local < size) & (rows < n)        # ragged vocab / row blocks
    lse, a, b, c = (coef_ref[:, q:q + 1] for q in range(4))
    col = off_ref[0] * block_v + local
    gx = c * jnp.exp(x - lse) - jnp.where(col == t_ref[...], a, 0.0) - b
    g = jnp.where(keep, gx, 0.0).astype(g_ref.dtype)
    g_ref[...] = g
    hid = h_ref[...]
    if n % block_n:                 # garbage rows of the ragged block: 0 x NaN is NaN
        hid = jnp.where(rows < n, hid, jnp.zeros_like(hid))
    part = lax.dot_general(g, hid, (((0,), (0,)), ((), ())), precision=_IN_KERNEL,
                           preferred_element_type=jnp.float32)

    @pl.when(i == 0)
    def _first():
        acc[...] = part

    @pl.when(i > 0)
    def _more():
        acc[...] += part

    @pl.when(i == last_i)
    def _store():
        dw_ref[...] = acc[...].astype(dw_ref.dtype)


def _bwd_cost(n: int, h: int, size: int, blocks, dtype):
    """Logits recomputed and G^T H over the padded grid, an exp per logit; HBM: W[chunk]
    once (resident across rows), H once per vocab block, G and dW[chunk] written once."""
    bn, bv = blocks
    isz = jnp.dtype(dtype).itemsize
    rn, rv = pl.cdiv(n, bn), pl.cdiv(size, bv)
    traffic = (2 * size * h + rv * n * h + n * size) * isz
    return cost(4 * rn * bn * rv * bv * h + 6 * n * size, traffic, n * size)


def _bwd_chunk(c0: int, size: int, blocks, hidden, weight, target, coef, dw,
               tgt: tpu_info.Target):
    """(G [n, size] in the input dtype, dW with rows [c0, c0 + size) written) for vocab
    columns [c0, c0 + size); ``dw``: dW so far (updated in place), None for the first chunk
    (its other rows are left for the later chunks). ``c0`` is a multiple of the vocab block."""
    (n, h), vocab = hidden.shape, weight.shape[0]
    bn, bv = blocks
    aliased = dw is not None
    row_w = pl.BlockSpec((bv, h), lambda j, i, o: (o[0] + j, 0))
    return pallas_call(
        functools.partial(_bwd_kernel, n=n, size=size, block_n=bn, block_v=bv, aliased=aliased),
        target=tgt,
        name="linear_cross_entropy_bwd",
        cost_estimate=_bwd_cost(n, h, size, blocks, hidden.dtype),
        vmem_bytes=bwd_vmem_bytes(bn, bv, h, hidden.dtype),
        dimension_semantics=("parallel", "arbitrary"),
        out_shape=[jax.ShapeDtypeStruct((n, size), hidden.dtype),
                   jax.ShapeDtypeStruct((vocab, h), weight.dtype)],
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(pl.cdiv(size, bv), pl.cdiv(n, bn)),
            in_specs=[pl.BlockSpec((bn, h), lambda j, i, o: (i, 0)), row_w,
                      pl.BlockSpec((bn, 1), lambda j, i, o: (i, 0)),
                      pl.BlockSpec((bn, 4), lambda j, i, o: (i, 0))]
                     + ([pl.BlockSpec(memory_space=pl.ANY)] if aliased else []),
            out_specs=[pl.BlockSpec((bn, bv), lambda j, i, o: (i, j)), row_w],
            scratch_shapes=[pltpu.VMEM((bv, h), jnp.float32)]),
        input_output_aliases={5: 1} if aliased else {},
    )(jnp.asarray([c0 // bv], jnp.int32), hidden, weight, target[:, None], coef,
      *([dw] if aliased else []))


def _backward(hidden, weight, target, coef, chunk: int, tgt: tpu_info.Target):
    """(dH, dW) by vocab chunks. The chunks are a Python loop (a few of them: see
    ``default_chunk``) so the compiler's figures and the cost model see every one. Each
    chunk's kernel writes its rows of dW in place (aliased) and reads W where it lies, so
    neither W nor dW is copied; an optimization barrier starts chunk c after chunk c-1's
    dH term, so XLA holds one G chunk at a time."""
    (n, h), vocab, f32 = hidden.shape, weight.shape[0], jnp.float32
    blocks = bwd_block_sizes(n, h, chunk, hidden.dtype, tgt.chip)
    if chunk < vocab:               # chunk starts must fall on vocab blocks
        chunk = max(blocks[1], chunk // blocks[1] * blocks[1])
    dh, dw = jnp.zeros(hidden.shape, f32), None
    for c0 in range(0, vocab, chunk):
        size = min(chunk, vocab - c0)
        # chunk c's kernel reads coef_c, available only once chunk c-1's dH term is
        dh, coef_c = lax.optimization_barrier((dh, coef)) if dw is not None else (dh, coef)
        g, dw = _bwd_chunk(c0, size, blocks, hidden, weight, target, coef_c, dw, tgt)
        w_c = lax.slice_in_dim(weight, c0, c0 + size)
        dh = dh + jnp.dot(g, w_c, precision=tpu_info.mxu_precision(w_c.dtype), preferred_element_type=f32)
    return dh.astype(hidden.dtype), dw


# ----------------------------------------------------------------------------- wrapper

def _row_loss(stats, target, vocab: int, ignore_index: int, eps: float):
    valid = target != ignore_index
    lse, xt, sx = stats[:, 0], stats[:, 1], stats[:, 2]
    loss = lse - (1.0 - eps) * xt - (eps / vocab) * sx
    return jnp.where(valid, loss, 0.0), valid


def _reduce(loss, valid, reduction: str):
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / valid.sum().astype(jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _lce(hidden, weight, target, ignore_index, reduction, eps, chunk, tgt):
    return _lce_fwd(hidden, weight, target, ignore_index, reduction, eps, chunk, tgt)[0]


def _lce_fwd(hidden, weight, target, ignore_index, reduction, eps, chunk, tgt):
    stats = _row_stats(hidden, weight, target, tgt)
    loss, valid = _row_loss(stats, target, weight.shape[0], ignore_index, eps)
    out = _reduce(loss, valid, reduction).astype(hidden.dtype)
    return out, (hidden, weight, target, stats[:, 0])


def _lce_bwd(ignore_index, reduction, eps, chunk, tgt, res, g):
    hidden, weight, target, lse = res
    vocab = weight.shape[0]
    valid = target != ignore_index
    g = g.astype(jnp.float32)
    if reduction == "mean":
        g = g / valid.sum().astype(jnp.float32)
    r = jnp.where(valid, jnp.broadcast_to(g, target.shape), 0.0)
    a, b = r * (1.0 - eps), r * (eps / vocab)
    coef = jnp.stack([lse, a, b, a + b * vocab], axis=1)
    dh, dw = _backward(hidden, weight, target, coef, chunk, tgt)
    return dh, dw, None


_lce.defvjp(_lce_fwd, _lce_bwd)


def linear_cross_entropy(hidden: jax.Array, weight: jax.Array, target: jax.Array, *,
                         ignore_index: int = -100, reduction: str = "mean",
                         label_smoothing: float = 0.0, chunk: int | None = None,
                         interpret: bool | None = None) -> jax.Array:
    """cross_entropy(hidden [n, h] @ weight [V, h]^T, target [n]) without materialising the
    logits; differentiable in hidden and weight (``jax.custom_vjp``). ``chunk``: vocab
    columns per backward step (default from ``default_chunk``)."""
    reason = supports(hidden.shape, weight.shape, hidden.dtype, target.dtype,
                      reduction=reduction, label_smoothing=label_smoothing)
    if reason is None and weight.dtype != hidden.dtype:
        reason = f"weight dtype {weight.dtype} != hidden dtype {hidden.dtype}"
    if reason:
        raise ValueError(f"linear_cross_entropy kernel: {reason}")
    n, vocab = hidden.shape[0], weight.shape[0]
    tgt = tpu_info.target(interpret)
    chunk = min(int(chunk), vocab) if chunk else default_chunk(n, vocab, hidden.dtype)
    return _lce(hidden, weight, target.astype(jnp.int32), int(ignore_index), reduction,
                float(label_smoothing), chunk, tgt)
