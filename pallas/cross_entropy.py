"""Cross entropy over logits [n, C] with class-index targets, one pass over the vocabulary.

Algorithm (per row block, vocabulary blocks visited in order, stats in f32 VMEM scratch):
    m <- -inf, s <- 0, x_t <- 0, wx <- 0
    for each vocab block X (columns >= C masked to -inf):
        m' = max(m, rowmax X);  s = s * exp(m - m') + sum exp(X - m');  m = m'
        x_t += X[target];  wx += sum_c w_c X_c            (wx only with label smoothing)
    lse = m + log s
Per row, with W = sum_c w_c and eps the label smoothing (torch's formula; eps <= 0 or nan
is none, and the smoothing term is left out then, as torch does: 0 * inf is nan):
    loss = (1 - eps) w_t (lse - x_t) + eps / C (W lse - wx),    0 where target == ignore_index
    mean divides the sum by sum of w_t over the non-ignored rows (nan when every row is
    ignored, as torch; their gradient stays 0).
Backward, one more pass (grid fully parallel), p = exp(X - lse), g the row's cotangent:
    dX = g [(1 - eps) w_t (p - onehot_t) + eps / C (W p - w)]
Class weights are constants (no gradient), as in torch.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info, tuned
from tpu_kernels.pallas.launch import cost, pallas_call
from tpu_kernels.pallas.reference.cross_entropy import smoothing
from tpu_kernels.pallas.tpu_info import round_up

REDUCTIONS = ("mean", "sum", "none")
_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
_ROW_BLOCK = 128
_VOCAB_BLOCKS = (4096, 2048, 1024, 512, 256, 128)


def vmem_bytes(block_n: int, block_v: int, dtype) -> int:
    """VMEM estimate of the larger (backward) kernel: double-buffered blocks, scratch and
    about four f32 [block_n, block_v] temporaries (upcast, exp, masks)."""
    f32 = jnp.float32
    io = 2 * 2 * tpu_info.tile_bytes((block_n, block_v), dtype)      # logits in, grad out
    small = 2 * (tpu_info.tile_bytes((1, block_v), f32) + 3 * tpu_info.tile_bytes((block_n, 1), f32))
    scratch = 4 * tpu_info.tile_bytes((block_n, 1), f32)
    temps = 4 * tpu_info.tile_bytes((block_n, block_v), f32)
    return io + small + scratch + temps


def block_sizes(n: int, n_cls: int, dtype, chip: tpu_info.Chip) -> tuple[int, int]:
    """(row block, vocab block): rows a multiple of the dtype's sublane tile, the widest
    128-multiple vocab block whose working set fits the chip's VMEM budget; a tuned
    table's entry (``tuned``) first."""
    hit = tuned.lookup_blocks("cross_entropy", chip, dtype, align=(tpu_info.sublane(dtype), 128), n=n, v=n_cls)
    if hit:
        return hit
    block_n = min(_ROW_BLOCK, round_up(n, tpu_info.sublane(dtype)))
    cap = round_up(n_cls, 128)
    for bv in _VOCAB_BLOCKS:
        if bv <= cap and vmem_bytes(block_n, bv, dtype) <= tpu_info.vmem_budget(chip):
            return block_n, bv
    return block_n, 128


def supports(logits_shape: tuple[int, ...], logits_dtype, target_dtype,
             weight_shape: tuple[int, ...] | None = None, *, reduction: str = "mean",
             label_smoothing: float = 0.0) -> str | None:
    """None when the kernel handles these arguments, else the reason it does not."""
    if len(logits_shape) != 2:
        return "logits must be 2-D [n, classes]"
    if jnp.dtype(logits_dtype) not in _DTYPES:
        return f"logits dtype {jnp.dtype(logits_dtype)} not in float32/bfloat16"
    if not jnp.issubdtype(jnp.dtype(target_dtype), jnp.integer):
        return "targets must be class indices (integer); probabilities are not supported"
    n, n_cls = logits_shape
    if n == 0 or n_cls == 0:
        return "empty logits"
    if n_cls >= 2**31:
        return "more than 2**31 - 1 classes do not fit int32 indices"
    if weight_shape is not None and tuple(weight_shape) != (n_cls,):
        return f"weight shape {tuple(weight_shape)} != ({n_cls},)"
    if reduction not in REDUCTIONS:
        return f"reduction {reduction!r} not in {REDUCTIONS}"
    if label_smoothing > 1.0:      # negative or nan: no smoothing, as torch (``smoothing``)
        return "label_smoothing must be in [0, 1]"
    return None


# ----------------------------------------------------------------------------- forward

def online_lse_step(x, j, block_v: int, n_cls: int, t_ref, m_sc, s_sc, xt_sc):
    """One vocabulary block of the online log-sum-exp: update the running max ``m_sc``,
    sum of exponentials ``s_sc`` and target logit ``xt_sc`` with f32 logits ``x``.
    Returns ``x`` with the columns past ``n_cls`` at -inf, and the valid-column mask."""
    cols = j * block_v + lax.broadcasted_iota(jnp.int32, x.shape, 1)
    valid = cols < n_cls                       # the tail block reads past C: mask it
    x = jnp.where(valid, x, -jnp.inf)
    m_old = m_sc[...]
    m_new = jnp.maximum(m_old, x.max(axis=1, keepdims=True))
    s_sc[...] = (s_sc[...] * jnp.exp(m_old - m_new)
                 + jnp.exp(x - m_new).sum(axis=1, keepdims=True))
    m_sc[...] = m_new
    xt_sc[...] += jnp.where(cols == t_ref[...], x, 0.0).sum(axis=1, keepdims=True)
    return x, valid


def _fwd_kernel(x_ref, t_ref, w_ref, out_ref, m_sc, s_sc, xt_sc, wx_sc, *,
                n_cls: int, block_v: int, smoothing: bool):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        s_sc[...] = jnp.zeros(s_sc.shape, jnp.float32)
        xt_sc[...] = jnp.zeros(xt_sc.shape, jnp.float32)
        wx_sc[...] = jnp.zeros(wx_sc.shape, jnp.float32)

    x, valid = online_lse_step(x_ref[...].astype(jnp.float32), j, block_v, n_cls, t_ref,
                               m_sc, s_sc, xt_sc)
    if smoothing:
        wx_sc[...] += jnp.where(valid, w_ref[...] * x, 0.0).sum(axis=1, keepdims=True)

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        out_ref[:, 0:1] = m_sc[...] + jnp.log(s_sc[...])
        out_ref[:, 1:2] = xt_sc[...]
        out_ref[:, 2:3] = wx_sc[...]


def _cost(logits, passes_out: int):
    """One exp per logit and a few VPU ops; the logits read once (``passes_out``: the
    gradient written once more)."""
    return cost(4 * logits.size, logits.size * logits.dtype.itemsize * (1 + passes_out),
                logits.size)


def _row_stats(logits, target, weight, smoothing: bool, tgt: tpu_info.Target):
    """Per-row (lse, x_target, sum_c w_c x_c) in f32, shape [n, 3]."""
    n, n_cls = logits.shape
    bn, bv = block_sizes(n, n_cls, logits.dtype, tgt.chip)
    grid = (pl.cdiv(n, bn), pl.cdiv(n_cls, bv))
    kernel = functools.partial(_fwd_kernel, n_cls=n_cls, block_v=bv, smoothing=smoothing)
    return pallas_call(
        kernel,
        target=tgt,
        name="cross_entropy_fwd",
        cost_estimate=_cost(logits, 0),
        vmem_bytes=vmem_bytes(bn, bv, logits.dtype),
        dimension_semantics=("parallel", "arbitrary"),
        out_shape=jax.ShapeDtypeStruct((n, 3), jnp.float32),
        grid=grid,
        in_specs=[pl.BlockSpec((bn, bv), lambda i, j: (i, j)),
                  pl.BlockSpec((bn, 1), lambda i, j: (i, 0)),
                  pl.BlockSpec((1, bv), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bn, 3), lambda i, j: (i, 0)),
        scratch_shapes=[pltpu.VMEM((bn, 1), jnp.float32) for _ in range(4)],
    )(logits, target[:, None], weight[None, :])


# ---------------------------------------------------------------------------- backward

def _bwd_kernel(x_ref, t_ref, coef_ref, w_ref, dx_ref, *, block_v: int):
    j = pl.program_id(1)
    x = x_ref[...].astype(jnp.float32)
    cols = j * block_v + lax.broadcasted_iota(jnp.int32, x.shape, 1)
    lse, a, b, c = (coef_ref[:, k:k + 1] for k in range(4))
    p = jnp.exp(x - lse)
    dx = c * p - jnp.where(cols == t_ref[...], a, 0.0) - b * w_ref[...]
    dx_ref[...] = dx.astype(dx_ref.dtype)   # tail columns are dropped by the store


def _grad_logits(logits, target, weight, coef, tgt: tpu_info.Target):
    """dX = c p - a onehot - b w with per-row (lse, a, b, c) in ``coef [n, 4]``."""
    n, n_cls = logits.shape
    bn, bv = block_sizes(n, n_cls, logits.dtype, tgt.chip)
    return pallas_call(
        functools.partial(_bwd_kernel, block_v=bv),
        target=tgt,
        name="cross_entropy_bwd",
        cost_estimate=_cost(logits, 1),
        vmem_bytes=vmem_bytes(bn, bv, logits.dtype),
        dimension_semantics=("parallel", "parallel"),
        out_shape=jax.ShapeDtypeStruct(logits.shape, logits.dtype),
        grid=(pl.cdiv(n, bn), pl.cdiv(n_cls, bv)),
        in_specs=[pl.BlockSpec((bn, bv), lambda i, j: (i, j)),
                  pl.BlockSpec((bn, 1), lambda i, j: (i, 0)),
                  pl.BlockSpec((bn, 4), lambda i, j: (i, 0)),
                  pl.BlockSpec((1, bv), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bn, bv), lambda i, j: (i, j)),
    )(logits, target[:, None], coef, weight[None, :])


# ----------------------------------------------------------------------------- wrapper

def _target_weight(target, weight, ignore_index: int):
    """w_t per row (0 on ignored rows) and the valid-row mask."""
    valid = target != ignore_index
    return jnp.where(valid, weight[jnp.where(valid, target, 0)], 0.0), valid


def _reduce(loss, total, reduction: str):
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / total


def _loss(stats, target, weight, ignore_index: int, reduction: str, eps: float):
    """torch's ``(1 - eps) nll + eps / C smooth``, each term reduced on its own, the
    smoothing term only when eps > 0 (its ``0 * inf`` would make a -inf logit's finite
    loss nan); ignored rows are selected away, never multiplied by 0 (a -inf logit)."""
    w_t, valid = _target_weight(target, weight, ignore_index)
    total = w_t.sum()
    lse, xt, wx = stats[:, 0], stats[:, 1], stats[:, 2]
    loss = _reduce(jnp.where(valid, w_t * (lse - xt), 0.0), total, reduction)
    if eps > 0:
        smooth = jnp.where(valid, weight.sum() * lse - wx, 0.0)
        loss = (1.0 - eps) * loss + (eps / weight.shape[0]) * _reduce(smooth, total, reduction)
    return loss


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _ce(logits, target, weight, ignore_index, reduction, eps, tgt):
    return _ce_fwd(logits, target, weight, ignore_index, reduction, eps, tgt)[0]


def _ce_fwd(logits, target, weight, ignore_index, reduction, eps, tgt):
    stats = _row_stats(logits, target, weight, eps > 0, tgt)
    out = _loss(stats, target, weight, ignore_index, reduction, eps).astype(logits.dtype)
    return out, (logits, target, weight, stats[:, 0])


def _ce_bwd(ignore_index, reduction, eps, tgt, res, g):
    logits, target, weight, lse = res
    n_cls = logits.shape[1]
    w_t, valid = _target_weight(target, weight, ignore_index)
    g = g.astype(jnp.float32)
    if reduction == "mean":
        g = g / w_t.sum()
    # selected, not scaled: ignored rows get 0 even when the mean divides by 0
    r = jnp.where(valid, jnp.broadcast_to(g, target.shape), 0.0)
    a = r * (1.0 - eps) * w_t
    b = r * (eps / n_cls)
    coef = jnp.stack([lse, a, b, a + b * weight.sum()], axis=1)
    dx = _grad_logits(logits, target, weight, coef, tgt)
    return dx, None, None


_ce.defvjp(_ce_fwd, _ce_bwd)


def cross_entropy(logits: jax.Array, target: jax.Array, weight: jax.Array | None = None, *,
                  ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, interpret: bool | None = None) -> jax.Array:
    """torch.nn.functional.cross_entropy(logits [n, C], target [n] int) as a Pallas kernel.

    Differentiable in ``logits`` (``jax.custom_vjp``); ``weight [C]`` is a constant.
    Targets outside [0, C) other than ``ignore_index`` give unspecified results.
    """
    reason = supports(logits.shape, logits.dtype, target.dtype,
                      None if weight is None else weight.shape,
                      reduction=reduction, label_smoothing=label_smoothing)
    if reason:
        raise ValueError(f"cross_entropy kernel: {reason}")
    n_cls = logits.shape[1]
    w = jnp.ones((n_cls,), jnp.float32) if weight is None else weight.astype(jnp.float32)
    return _ce(logits, target.astype(jnp.int32), lax.stop_gradient(w), int(ignore_index),
               reduction, smoothing(label_smoothing), tpu_info.target(interpret))
