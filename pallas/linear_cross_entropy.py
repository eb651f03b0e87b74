"""Fused linear + cross entropy: loss of (hidden [n, h] @ weight[V, h]^T) without the [n, V]
logits in HBM.

Forward, one Pallas kernel, grid (row blocks "parallel", vocab blocks, hidden blocks):
    acc = sum_k H[i, k] W[j, k]^T                (f32 VMEM scratch, logits block stays in VMEM)
    on the last k: online max / sum-exp / target logit / logit sum over vocab block j
    lse = m + log s;  loss = lse - (1 - eps) x_t - eps / V sum_c x_c   (0 on ignored rows)
Backward, over vocab chunks [c0, c0 + chunk) (the last chunk is shifted back to end at V and
its already-done columns masked):
    G = g [(1 - eps)(softmax - onehot_t) + eps / V (V softmax - 1)]   (Pallas: logits block
        recomputed in VMEM, written as f32 [n, chunk] -- the only vocab-sized temporary)
    dH += G W[c0:c0+chunk]   (f32 carry)        dW[c0:c0+chunk] = G^T H   (f32 accumulation)
"""
from __future__ import annotations

import functools

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
_ROW_BLOCK, _VOCAB_BLOCK = 256, 512
_HIDDEN_BLOCKS = (1024, 512, 256, 128)
_CHUNK_BYTES = 64 * 1024 * 1024         # f32 [n, chunk] grad-logits temporary per chunk


def _hidden_block(h: int) -> int | None:
    """The whole hidden dim when small, else a 128-multiple dividing it (no tail to mask in
    the contraction); None when neither exists."""
    if h <= _HIDDEN_BLOCKS[0]:
        return h
    return next((b for b in _HIDDEN_BLOCKS if h % b == 0), None)


def vmem_bytes(block_n: int, block_v: int, block_h: int, dtype) -> int:
    """Double-buffered hidden/weight blocks, the f32 logits accumulator, ~3 f32 logits-block
    temporaries, the f32 grad block (double-buffered) and small per-row blocks."""
    f32 = jnp.float32
    tile = lambda r, c, dt: tpu_info.tile_bytes((r, c), dt)  # noqa: E731
    ins = 2 * (tile(block_n, block_h, dtype) + tile(block_v, block_h, dtype))
    logits = (1 + 3 + 2) * tile(block_n, block_v, f32)
    rows = 2 * 3 * tile(block_n, 4, f32) + 4 * tile(block_n, 1, f32)
    return ins + logits + rows


def block_sizes(n: int, h: int, vocab: int, dtype, chip: tpu_info.Chip) -> tuple[int, int, int]:
    """(rows, vocab, hidden) blocks: MXU-friendly multiples, shrunk until they fit VMEM."""
    bn = min(_ROW_BLOCK, round_up(n, tpu_info.sublane(dtype)))
    bv = min(_VOCAB_BLOCK, round_up(vocab, 128))
    bh = _hidden_block(h) or 128
    while vmem_bytes(bn, bv, bh, dtype) > tpu_info.vmem_budget(chip) and bv > 128:
        bv //= 2
    return bn, bv, bh


def default_chunk(n: int, vocab: int, block_v: int) -> int:
    """Vocab columns per backward chunk: the f32 [n, chunk] temporary stays near
    ``_CHUNK_BYTES``; a multiple of the vocab block, never more than the vocabulary."""
    chunk = max(block_v, _CHUNK_BYTES // (4 * max(n, 1)) // block_v * block_v)
    return min(chunk, vocab)


def peak_logits_bytes(n: int, h: int, vocab: int, chunk: int | None = None,
                      dtype=jnp.bfloat16, chip: str = "v6e") -> dict[str, int]:
    """Analytic count (not measured) of the big temporaries of one forward+backward.
    Unfused linear + cross_entropy: at least the f32 logits [n, V] and their f32 grad [n, V]
    (a lower bound; see ``measured_unfused_temp_bytes``). Fused: the f32 grad chunk
    [n, chunk], the f32 dH carry [n, h] and the f32 dW chunk [chunk, h]."""
    chunk = chunk or default_chunk(n, vocab, block_sizes(n, h, vocab, dtype,
                                                         tpu_info.chip(chip))[1])
    unfused = 2 * n * vocab * 4
    fused = n * chunk * 4 + n * h * 4 + chunk * h * 4
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
    if vocab >= 2**31:
        return "vocab >= 2**31 does not fit int32 indices"
    if _hidden_block(h) is None:
        return f"hidden size {h} > {_HIDDEN_BLOCKS[0]} and not a multiple of 128"
    if reduction not in REDUCTIONS:
        return f"reduction {reduction!r} not in {REDUCTIONS}"
    if not 0.0 <= label_smoothing <= 1.0:
        return "label_smoothing must be in [0, 1]"
    return None


def _logits_block(h_ref, w_ref, acc):
    """acc (+)= H_ik W_jk^T over the hidden axis (grid axis 2), f32 on the MXU."""
    @pl.when(pl.program_id(2) == 0)
    def _zero():
        acc[...] = jnp.zeros(acc.shape, jnp.float32)

    acc[...] += lax.dot_general(h_ref[...], w_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------- forward

def _fwd_kernel(h_ref, w_ref, t_ref, out_ref, acc, m_sc, s_sc, xt_sc, sx_sc, *,
                vocab: int, block_v: int):
    j, k = pl.program_id(1), pl.program_id(2)

    @pl.when((j == 0) & (k == 0))
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        for r in (s_sc, xt_sc, sx_sc):
            r[...] = jnp.zeros(r.shape, jnp.float32)

    _logits_block(h_ref, w_ref, acc)

    @pl.when(k == pl.num_programs(2) - 1)
    def _update():
        x, valid = online_lse_step(acc[...], j, block_v, vocab, t_ref, m_sc, s_sc, xt_sc)
        sx_sc[...] += jnp.where(valid, x, 0.0).sum(axis=1, keepdims=True)

    @pl.when((j == pl.num_programs(1) - 1) & (k == pl.num_programs(2) - 1))
    def _finish():
        out_ref[:, 0:1] = m_sc[...] + jnp.log(s_sc[...])
        out_ref[:, 1:2] = xt_sc[...]
        out_ref[:, 2:3] = sx_sc[...]


def _cost(n: int, h: int, vocab: int, blocks, dtype, *, grad: bool):
    """The logits matmul, an exp per logit; HBM traffic: W once per row block, H once per
    vocab block (plus the f32 grad chunk written, for the backward kernel)."""
    bn, bv, _ = blocks
    isz = jnp.dtype(dtype).itemsize
    traffic = (vocab * h * pl.cdiv(n, bn) + n * h * pl.cdiv(vocab, bv)) * isz
    return cost(2 * n * vocab * h + 6 * n * vocab, traffic + (4 * n * vocab if grad else 0),
                n * vocab)


def _row_stats(hidden, weight, target, tgt: tpu_info.Target):
    """Per-row (lse, x_target, sum_c x_c), f32 [n, 3]."""
    (n, h), vocab = hidden.shape, weight.shape[0]
    bn, bv, bh = blocks = block_sizes(n, h, vocab, hidden.dtype, tgt.chip)
    return pallas_call(
        functools.partial(_fwd_kernel, vocab=vocab, block_v=bv),
        target=tgt,
        name="linear_cross_entropy_fwd",
        cost_estimate=_cost(n, h, vocab, blocks, hidden.dtype, grad=False),
        vmem_bytes=vmem_bytes(bn, bv, bh, hidden.dtype),
        dimension_semantics=("parallel", "arbitrary", "arbitrary"),
        out_shape=jax.ShapeDtypeStruct((n, 3), jnp.float32),
        grid=(pl.cdiv(n, bn), pl.cdiv(vocab, bv), h // bh),
        in_specs=[pl.BlockSpec((bn, bh), lambda i, j, k: (i, k)),
                  pl.BlockSpec((bv, bh), lambda i, j, k: (j, k)),
                  pl.BlockSpec((bn, 1), lambda i, j, k: (i, 0))],
        out_specs=pl.BlockSpec((bn, 3), lambda i, j, k: (i, 0)),
        scratch_shapes=[pltpu.VMEM((bn, bv), jnp.float32)]
                       + [pltpu.VMEM((bn, 1), jnp.float32) for _ in range(4)],
    )(hidden, weight, target[:, None])


# ---------------------------------------------------------------------------- backward

def _grad_kernel(off_ref, h_ref, w_ref, t_ref, coef_ref, g_ref, acc, *, vocab: int,
                 block_v: int):
    # Grid indices are read here, not inside pl.when bodies (interpret mode cannot).
    col0, last_k = off_ref[0] + pl.program_id(1) * block_v, pl.num_programs(2) - 1
    _logits_block(h_ref, w_ref, acc)

    @pl.when(pl.program_id(2) == last_k)
    def _grad():
        x = acc[...]
        cols = col0 + lax.broadcasted_iota(jnp.int32, x.shape, 1)
        keep = (cols < vocab) & (cols >= off_ref[1])   # past V / done by the last chunk
        lse, a, b, c = (coef_ref[:, q:q + 1] for q in range(4))
        gx = c * jnp.exp(x - lse) - jnp.where(cols == t_ref[...], a, 0.0) - b
        g_ref[...] = jnp.where(keep, gx, 0.0)


def _grad_chunk(offsets, hidden, w_chunk, target, coef, vocab: int, tgt: tpu_info.Target):
    """f32 dlogits [n, chunk] for weight rows w_chunk = weight[offsets[0]:+chunk]."""
    (n, h), chunk = hidden.shape, w_chunk.shape[0]
    bn, bv, bh = blocks = block_sizes(n, h, vocab, hidden.dtype, tgt.chip)
    return pallas_call(
        functools.partial(_grad_kernel, vocab=vocab, block_v=bv),
        target=tgt,
        name="linear_cross_entropy_grad",
        cost_estimate=_cost(n, h, chunk, blocks, hidden.dtype, grad=True),
        vmem_bytes=vmem_bytes(bn, bv, bh, hidden.dtype),
        dimension_semantics=("parallel", "parallel", "arbitrary"),
        out_shape=jax.ShapeDtypeStruct((n, chunk), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(pl.cdiv(n, bn), pl.cdiv(chunk, bv), h // bh),
            in_specs=[pl.BlockSpec((bn, bh), lambda i, j, k, o: (i, k)),
                      pl.BlockSpec((bv, bh), lambda i, j, k, o: (j, k)),
                      pl.BlockSpec((bn, 1), lambda i, j, k, o: (i, 0)),
                      pl.BlockSpec((bn, 4), lambda i, j, k, o: (i, 0))],
            out_specs=pl.BlockSpec((bn, bv), lambda i, j, k, o: (i, j)),
            scratch_shapes=[pltpu.VMEM((bn, bv), jnp.float32)]),
    )(offsets, hidden, w_chunk, target[:, None], coef)


def _backward(hidden, weight, target, coef, chunk: int, tgt: tpu_info.Target):
    """(dH, dW) by vocab chunks, one after another in a ``fori_loop``: one f32 grad chunk,
    one f32 dW chunk and the f32 dH carry are all the temporaries, whatever the vocab."""
    vocab, f32 = weight.shape[0], jnp.float32

    def step(c, carry):
        dh, dw = carry
        c0 = c * chunk
        start = jnp.minimum(c0, vocab - chunk)      # last chunk shifted back to end at V
        w_c = lax.dynamic_slice_in_dim(weight, start, chunk)
        offsets = jnp.stack([start, c0]).astype(jnp.int32)   # SMEM scalars are 32-bit
        g = _grad_chunk(offsets, hidden, w_c, target, coef, vocab, tgt)
        dh = dh + jnp.dot(g, w_c, preferred_element_type=f32)
        # rows [start, c0) belong to the previous chunk: g is 0 there, so adding is exact
        dw_c = jnp.dot(g.T, hidden, preferred_element_type=f32)
        old = lax.dynamic_slice_in_dim(dw, start, chunk).astype(f32)
        return dh, lax.dynamic_update_slice_in_dim(dw, (old + dw_c).astype(dw.dtype), start, 0)

    init = (jnp.zeros(hidden.shape, f32), jnp.zeros(weight.shape, weight.dtype))
    dh, dw = lax.fori_loop(0, pl.cdiv(vocab, chunk), step, init)
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
    bv = block_sizes(n, hidden.shape[1], vocab, hidden.dtype, tgt.chip)[1]
    chunk = min(int(chunk), vocab) if chunk else default_chunk(n, vocab, bv)
    return _lce(hidden, weight, target.astype(jnp.int32), int(ignore_index), reduction,
                float(label_smoothing), chunk, tgt)
