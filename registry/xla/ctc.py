"""CTC loss lowerings: ``_ctc_loss`` (int-list and tensor lengths) and its backward.

The forward variables (log alpha) run as one ``lax.scan`` over time on the extended label
sequence (blanks between labels); the backward runs the beta recursion the same way and
forms torch's gradient with respect to the log probabilities. Half types compute in float32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels.registry.context import out_dtype, out_shape
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import float_compute, meta_like

# Torch ships no Meta kernel for the backward; its result is shaped like the log probs.
for _op in ("_ctc_loss_backward", "_ctc_loss_backward.Tensor"):
    meta_like(_op, "log_probs")


def _lse(*xs: jax.Array) -> jax.Array:
    """logsumexp of same-shaped arrays, -inf (not NaN) when all are -inf."""
    m = xs[0]
    for x in xs[1:]:
        m = jnp.maximum(m, x)
    safe = jnp.where(jnp.isfinite(m), m, 0.0)
    return safe + jnp.log(sum(jnp.exp(x - safe) for x in xs))


def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank, width):
    """Batched (T, N, C) log probs, extended labels (N, width) and the per-position masks."""
    lp = log_probs if log_probs.ndim == 3 else log_probs[:, None, :]
    n = lp.shape[1]
    in_len = jnp.asarray(input_lengths, jnp.int64).reshape(n)
    tg_len = jnp.asarray(target_lengths, jnp.int64).reshape(n)
    s_max = (width - 1) // 2
    pos = jnp.arange(s_max)
    if targets.ndim == 2 or (targets.ndim == 1 and log_probs.ndim == 2):   # padded (N, S)
        padded = targets.reshape(n, -1)[:, :s_max]
        padded = jnp.pad(padded, ((0, 0), (0, s_max - padded.shape[1])))
    elif targets.size:   # 1-d concatenated targets
        start = jnp.cumsum(tg_len) - tg_len
        padded = targets[jnp.clip(start[:, None] + pos, 0, targets.shape[0] - 1)]
    else:
        padded = jnp.zeros((n, s_max), jnp.int64)
    padded = jnp.where(pos < tg_len[:, None], padded, blank)
    ext = jnp.full((n, width), blank, padded.dtype).at[:, 1::2].set(padded)
    valid = jnp.arange(width) < 2 * tg_len[:, None] + 1
    # a skip from s-2 is allowed onto a label that differs from the label two back
    skip = jnp.concatenate([jnp.zeros((n, 2), bool), (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])], 1)
    return lp, ext, valid, skip, in_len, tg_len


def _ctc_alpha(lp, ext, valid, skip, in_len):
    """log_alpha (T, N, width): forward variables, -inf outside each sequence."""
    ninf = jnp.asarray(-jnp.inf, lp.dtype)
    emit = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (lp.shape[0],) + ext.shape), axis=2)
    first = jnp.where((jnp.arange(ext.shape[1]) < 2) & valid, emit[0], ninf)

    def step(a, xs):
        t, e = xs
        shift1 = jnp.pad(a, ((0, 0), (1, 0)), constant_values=-jnp.inf)[:, :-1]
        shift2 = jnp.where(skip, jnp.pad(a, ((0, 0), (2, 0)), constant_values=-jnp.inf)[:, :-2], ninf)
        new = jnp.where(valid & (t < in_len[:, None]), _lse(a, shift1, shift2) + e, ninf)
        return new, new

    _, rest = jax.lax.scan(step, first, (jnp.arange(1, lp.shape[0]), emit[1:]))
    return jnp.concatenate([first[None], rest], 0), emit


def _ctc_end(alpha_t, tg_len):
    """-log p from the alphas at the last time step of each sequence."""
    last = jnp.take_along_axis(alpha_t, (2 * tg_len)[:, None], axis=1)[:, 0]
    prev = jnp.take_along_axis(alpha_t, jnp.maximum(2 * tg_len - 1, 0)[:, None], axis=1)[:, 0]
    return -jnp.where(tg_len > 0, _lse(last, prev), last)


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity, width, ct):
    lp, ext, valid, skip, in_len, tg_len = _ctc_setup(log_probs.astype(ct), targets, input_lengths,
                                                      target_lengths, blank, width)
    alpha, _ = _ctc_alpha(lp, ext, valid, skip, in_len)
    at_end = jnp.take_along_axis(alpha, jnp.maximum(in_len - 1, 0)[None, :, None], axis=0)[0]
    nll = _ctc_end(at_end, tg_len)
    if zero_infinity:
        nll = jnp.where(jnp.isinf(nll), 0.0, nll)
    log_alpha = jnp.swapaxes(alpha, 0, 1)
    if log_probs.ndim == 2:   # unbatched
        return nll[0], log_alpha[0]
    return nll, log_alpha


@xla("aten::_ctc_loss")
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    return _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity,
                        out_shape(1)[-1], float_compute(out_dtype()))


def _check_ctc_lengths(log_probs, targets, input_lengths, target_lengths) -> None:
    """CPU's checks of the lengths (read here, as CPU reads them into lists): a length past
    the input or the padded targets would index outside them."""
    where = " (while checking arguments for ctc_loss_allocate_outputs)"
    n_t = log_probs.shape[0]
    for v in np.asarray(input_lengths).reshape(-1).tolist():
        if v > n_t:
            raise RuntimeError(f"Expected input_lengths to have value at most {n_t}, but got value {v}{where}")
    if targets.ndim == 2:   # padded (N, S)
        for v in np.asarray(target_lengths).reshape(-1).tolist():
            if v > targets.shape[1]:
                raise RuntimeError(f"Expected tensor to have size at least {v} at dimension 1, but got "
                                   f"size {targets.shape[1]} for argument #2 'targets'{where}")


@xla("aten::_ctc_loss.Tensor", data_dependent=True)
def ctc_loss_tensor(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _check_ctc_lengths(log_probs, targets, input_lengths, target_lengths)
    # no meta function: log_alpha's width depends on the longest target
    width = 2 * int(jnp.max(target_lengths, initial=0)) + 1
    ct = float_compute(log_probs.dtype)
    nll, log_alpha = _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity,
                                  width, ct)
    return nll.astype(log_probs.dtype), log_alpha.astype(log_probs.dtype)


@xla("aten::_ctc_loss_backward", "aten::_ctc_loss_backward.Tensor")
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood,
                      log_alpha, blank, zero_infinity=False):
    """torch's gradient: exp(lp) - exp(log(sum of alpha*beta over the class's positions) + nll - lp),
    which is the gradient through the log_softmax that produced ``log_probs``."""
    ct = float_compute(log_probs.dtype)
    width = log_alpha.shape[-1]
    lp, ext, valid, skip, in_len, tg_len = _ctc_setup(log_probs.astype(ct), targets, input_lengths,
                                                      target_lengths, blank, width)
    n_t = lp.shape[0]
    alpha = jnp.swapaxes(log_alpha.astype(ct).reshape(-1, n_t, width), 0, 1)
    ninf = jnp.asarray(-jnp.inf, ct)
    emit = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (n_t,) + ext.shape), axis=2)
    s_idx = jnp.arange(width)
    is_end = valid & ((s_idx == 2 * tg_len[:, None]) | (s_idx == 2 * tg_len[:, None] - 1))
    skip_next = jnp.pad(skip[:, 2:], ((0, 0), (0, 2)), constant_values=False)

    def step(b, xs):
        t, e = xs
        next1 = jnp.pad(b, ((0, 0), (0, 1)), constant_values=-jnp.inf)[:, 1:]
        next2 = jnp.where(skip_next, jnp.pad(b, ((0, 0), (0, 2)), constant_values=-jnp.inf)[:, 2:], ninf)
        rec = _lse(b, next1, next2) + e
        start = jnp.where(is_end, e, ninf)
        last = t == in_len[:, None] - 1
        new = jnp.where(last, start, jnp.where((t < in_len[:, None] - 1) & valid, rec, ninf))
        return new, new

    init = jnp.full(ext.shape, -jnp.inf, ct)
    _, beta = jax.lax.scan(step, init, (jnp.arange(n_t), emit), reverse=True)
    ab = alpha + beta                                                    # (T, N, width)
    m = jnp.max(ab, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    onehot = (ext[:, :, None] == jnp.arange(lp.shape[2])).astype(ct)    # (N, width, C)
    lcab = jnp.log(jnp.einsum("tns,nsc->tnc", jnp.exp(ab - m), onehot,
                              precision=jax.lax.Precision.HIGHEST)) + m
    nll = neg_log_likelihood.astype(ct).reshape(-1)
    g = grad.astype(ct).reshape(-1)
    res = (jnp.exp(lp) - jnp.exp(lcab + nll[None, :, None] - lp)) * g[None, :, None]
    keep = jnp.arange(n_t)[:, None] < in_len[None, :]
    if zero_infinity:
        keep = keep & ~jnp.isinf(nll)[None, :]
    return jnp.where(keep[:, :, None], res, 0.0).reshape(log_probs.shape)
