"""Normalisation lowerings: layer, group, batch, RMS and weight norm, with their backwards.

Statistics are computed in float32 for half types (as torch's CPU kernels do); every
forward returns its saved statistics in the layout the matching backward receives.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from tpu_kernels.registry.context import out_meta, out_shape
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import float_compute


# -- shared math ------------------------------------------------------------------------------
def _stats(x: jax.Array, axes: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """Mean and biased variance over ``axes`` (kept), two-pass for accuracy."""
    mean = x.mean(axes, keepdims=True)
    return mean, jnp.square(x - mean).mean(axes, keepdims=True)


def _centred(x: jax.Array, mean: jax.Array) -> jax.Array:
    """``x - mean`` for a normalised output, written ``x + (-mean)``: the same values, but
    not the same expression as ``_stats``'s ``x - mean``, so XLA does not share one array
    between the variance and the output. Shared, XLA:CPU writes it to memory between the
    two reductions (a full extra write and read); apart, each fusion recomputes it. XLA:TPU
    fuses both forms alike (libtpu's v6e estimate is the same)."""
    return x + (-mean)


def _normalize_backward(x, g, mean, rstd, axes):
    """d/dx of ``(x - mean(x)) * rstd(x)`` (statistics over ``axes``) applied to cotangent ``g``."""
    xhat = (x - mean) * rstd
    return rstd * (g - g.mean(axes, keepdims=True) - xhat * (g * xhat).mean(axes, keepdims=True))


def output_wanted(i: int) -> bool:
    """Torch's meta returns a tensor (not None) for output ``i`` of the op being lowered.

    Backwards follow this rather than ``output_mask``: the meta functions sometimes return
    a gradient the mask did not ask for (and None for a missing weight's)."""
    try:
        out_meta(i)
        return True
    except (RuntimeError, IndexError):
        return False


def _masked(*values):
    """Each value, or None where torch returns an undefined tensor."""
    return tuple(v if v is not None and output_wanted(i) else None for i, v in enumerate(values))


def _f(x, acc):
    return None if x is None else x.astype(acc)


# -- layer norm ---------------------------------------------------------------------------------
def _trailing(x, normalized_shape):
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


@xla("aten::native_layer_norm")
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    acc = float_compute(input.dtype)
    x = input.astype(acc)
    mean, var = _stats(x, _trailing(x, normalized_shape))
    rstd = lax.rsqrt(var + eps)
    y = _centred(x, mean) * rstd
    if weight is not None:
        y = y * weight.astype(acc)
    if bias is not None:
        y = y + bias.astype(acc)
    return y, mean, rstd


@xla("aten::native_layer_norm_backward")
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    acc = float_compute(input.dtype)
    x, go, mean, rstd = (t.astype(acc) for t in (input, grad_out, mean, rstd))
    axes = _trailing(x, normalized_shape)
    outer = tuple(range(x.ndim - len(axes)))
    g = go if weight is None else go * weight.astype(acc)
    dx = _normalize_backward(x, g, mean, rstd, axes) if output_wanted(0) else None
    # go * xhat, the xhat dx computes: XLA:CPU writes that one array and reads it in both
    # (go * (x - mean) * rstd wrote x - mean and rstd's broadcast as well)
    dw = (go * ((x - mean) * rstd)).sum(outer) if output_wanted(1) else None
    db = go.sum(outer) if output_wanted(2) else None
    return _masked(dx, dw, db)


# -- RMS norm -----------------------------------------------------------------------------------
@xla("aten::_fused_rms_norm")
def _fused_rms_norm(input, normalized_shape, weight, eps):
    acc = float_compute(input.dtype)
    x = input.astype(acc)
    if eps is None:
        eps = jnp.finfo(acc).eps
    rstd = lax.rsqrt(jnp.square(x).mean(_trailing(x, normalized_shape), keepdims=True) + eps)
    y = x * rstd
    if weight is not None:
        y = y * weight
    return y, rstd


@xla("aten::_fused_rms_norm_backward")
def _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    acc = float_compute(input.dtype)
    x, go, rstd = (t.astype(acc) for t in (input, grad_out, rstd))
    axes = _trailing(x, normalized_shape)
    xhat = x * rstd
    g = go if weight is None else go * weight.astype(acc)
    dx = rstd * (g - xhat * (g * xhat).mean(axes, keepdims=True)) if output_wanted(0) else None
    dw = None
    if output_wanted(1):
        dw = (go * xhat).sum(tuple(range(x.ndim - len(axes))))
    return _masked(dx, dw)


# -- group norm ---------------------------------------------------------------------------------
@xla("aten::native_group_norm")
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    acc = float_compute(input.dtype)
    x = input.astype(acc).reshape(N, group, C // group * HxW)   # not -1: N may be 0
    mean, var = _stats(x, (2,))
    rstd = lax.rsqrt(var + eps)
    y = (_centred(x, mean) * rstd).reshape(N, C, HxW)
    if weight is not None:
        y = y * weight.astype(acc)[:, None]
    if bias is not None:
        y = y + bias.astype(acc)[:, None]
    return y.reshape(input.shape), mean.reshape(N, group), rstd.reshape(N, group)


@xla("aten::native_group_norm_backward")
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    acc = float_compute(input.dtype)
    x = input.astype(acc).reshape(N, group, C // group * HxW)   # not -1: N may be 0
    go = grad_out.astype(acc).reshape(N, C, HxW)
    mean = mean.astype(acc).reshape(N, group, 1)
    rstd = rstd.astype(acc).reshape(N, group, 1)
    dx = dw = db = None
    if output_wanted(0):
        g = go if weight is None else go * weight.astype(acc)[:, None]
        dx = _normalize_backward(x, g.reshape(x.shape), mean, rstd, (2,)).reshape(input.shape)
    if output_wanted(1):
        xhat = ((x - mean) * rstd).reshape(N, C, HxW)
        dw = (go * xhat).sum((0, 2))
    if output_wanted(2):
        db = go.sum((0, 2))
    return _masked(dx, dw, db)


# -- batch norm ---------------------------------------------------------------------------------
def _channel(v, ndim):
    """A per-channel vector shaped to broadcast against (N, C, *spatial)."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _scale_shift(x, mean, invstd, weight, bias):
    """``(x - mean) * invstd * weight + bias`` as one scale and shift per channel, as torch's
    CPU kernel computes it (per-channel vectors in, ``x``'s layout out)."""
    alpha = invstd if weight is None else invstd * weight.astype(invstd.dtype)
    beta = -mean * alpha if bias is None else bias.astype(alpha.dtype) - mean * alpha
    return x * _channel(alpha, x.ndim) + _channel(beta, x.ndim)


def _reduce_axes(x):
    return (0, *range(2, x.ndim))


def _stat_dtype(input, *params):
    """The saved statistics' dtype on torch's CPU: the input's, except for a half-type input
    with a parameter or running statistic of another type ("mixed type"): float32."""
    dt = input.dtype
    if dt != float_compute(dt) and any(p is not None and p.dtype != dt for p in params):
        return float_compute(dt)
    return dt


def _rounding_to(sdt, acc):
    """Rounding of ``acc`` values to the stat dtype ``sdt``: torch's CPU kernel keeps a
    half-type input's saved mean and inverse std, and the intermediate variance sum, in
    that type; float32 statistics ("mixed type", or a float32 input) are not rounded."""
    if sdt == acc:
        return lambda v: v
    return lambda v: v.astype(sdt).astype(acc)


def _bn_train(input, weight, bias, eps, running_mean=None, running_var=None):
    """Batch statistics: (y, mean, invstd, biased var), stats as (C,) float vectors.

    For half-type parameters torch's CPU kernel rounds the mean, the sum of squares, the
    variance (sum / n, both in the half type) and the inverse std to the half type before
    normalising with them; the same rounding here gives the same outputs."""
    acc = float_compute(input.dtype)
    x = input.astype(acc)
    mean, var = _stats(x, _reduce_axes(x))
    mean, var = mean.reshape(-1), var.reshape(-1)
    sdt = _stat_dtype(input, weight, bias, running_mean, running_var)
    rnd = _rounding_to(sdt, acc)
    n = _count(input)
    if rnd(var) is not var:
        mean, var = rnd(mean), rnd(rnd(var * n) / rnd(jnp.asarray(n, acc)))
    invstd = rnd(lax.rsqrt(var + eps))
    y = _scale_shift(x, mean, invstd, weight, bias).astype(input.dtype)
    return y, mean.astype(sdt), invstd.astype(sdt), var


def _bn_eval(input, weight, bias, running_mean, running_var, eps):
    """Normalise with running statistics: (y, saved mean, saved invstd) as torch's meta shapes them
    (the running stats on accelerators, empty on CPU)."""
    acc = float_compute(input.dtype)
    x = input.astype(acc)
    mean, invstd = running_mean.astype(acc), lax.rsqrt(running_var.astype(acc) + eps)
    y = _scale_shift(x, mean, invstd, weight, bias).astype(input.dtype)
    sdt = _stat_dtype(input, weight, bias, running_mean, running_var)
    # no output metadata when traced without torch's meta (it raises for
    # _batch_norm_no_update with no weight): then the [C] layout the meta gives tpu tensors
    if output_wanted(1) and out_shape(1) == (0,):
        return y, jnp.zeros((0,), sdt), jnp.zeros((0,), sdt)
    return y, mean.astype(sdt), invstd.astype(sdt)


def _updated(running_mean, running_var, mean, var, momentum, n):
    """Running statistics after one step (the variance enters unbiased)."""
    new_mean = (1 - momentum) * running_mean + momentum * mean.astype(running_mean.dtype)
    unbiased = var * (n / (n - 1)) if n > 1 else var * jnp.nan  # torch: 0/0
    new_var = (1 - momentum) * running_var + momentum * unbiased.astype(running_var.dtype)
    return new_mean, new_var


def _count(input):
    return input.size // input.shape[1] if input.ndim > 1 else 0


def _bn_refuses_legacy_update(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if training and running_mean is not None:
        return ("native_batch_norm updates running stats in place but its schema does not say so, "
                "so the dispatcher would not write them; the decomposition routes the update")
    return None


@xla("aten::native_batch_norm", supports=_bn_refuses_legacy_update)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        return _bn_train(input, weight, bias, eps, running_mean, running_var)[:3]
    return _bn_eval(input, weight, bias, running_mean, running_var, eps)


@xla("aten::_native_batch_norm_legit.default")
def _native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training:
        return (*_bn_eval(input, weight, bias, running_mean, running_var, eps), None, None)
    y, mean, invstd, var = _bn_train(input, weight, bias, eps, running_mean, running_var)
    return (y, mean, invstd, *_updated(running_mean, running_var, mean, var, momentum, _count(input)))


@xla("aten::_native_batch_norm_legit.no_stats")
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _bn_train(input, weight, bias, eps)[:3]


@xla("aten::_native_batch_norm_legit_no_training")
def _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _bn_eval(input, weight, bias, running_mean, running_var, eps)


@xla("aten::_batch_norm_no_update")
def _batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    # not _legit_no_training's impl plus a reserve "where a 4th output is wanted": torch's
    # meta raises for a None weight/bias, and traced without it the impl must know its outputs
    return (*_bn_eval(input, weight, bias, running_mean, running_var, eps), jnp.zeros((0,), jnp.uint8))


@xla("aten::_batch_norm_with_update", "aten::_batch_norm_with_update_functional")
def _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    y, mean, invstd, var = _bn_train(input, weight, bias, eps, running_mean, running_var)
    new_stats = _updated(running_mean, running_var, mean, var, momentum, _count(input))
    return (y, mean, invstd, jnp.zeros((0,), jnp.uint8), *new_stats)


def _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps):
    acc = float_compute(input.dtype)
    x, go = input.astype(acc), grad_out.astype(acc)
    axes = _reduce_axes(x)
    if train:
        mean, invstd = save_mean.astype(acc), save_invstd.astype(acc)
    else:
        mean, invstd = running_mean.astype(acc), lax.rsqrt(running_var.astype(acc) + eps)
    mean, invstd = _channel(mean, x.ndim), _channel(invstd, x.ndim)
    g = go if weight is None else go * _channel(weight.astype(acc), x.ndim)
    dx = dw = db = None
    if output_wanted(0):
        dx = _normalize_backward(x, g, mean, invstd, axes) if train else g * invstd
    if output_wanted(1):
        dw = (go * (x - mean) * invstd).sum(axes)
    if output_wanted(2):
        db = go.sum(axes)
    return _masked(dx, dw, db)


@xla("aten::native_batch_norm_backward")
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask):
    return _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                        save_invstd, train, eps)


@xla("aten::batch_norm_backward")
def batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                        update, eps, output_mask, reserve):
    # save_var holds the saved inverse std, as native_batch_norm_backward's save_invstd
    return _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                        update, eps)


# -- weight norm ----------------------------------------------------------------------------------
def _norm_axes(v, dim: int) -> tuple[int, ...]:
    if dim == -1 and v.ndim > 0:  # torch's norm_except_dim: -1 means the whole tensor
        return tuple(range(v.ndim))
    return tuple(a for a in range(v.ndim) if a != dim % max(v.ndim, 1))


@xla("aten::_weight_norm_interface")
def _weight_norm_interface(v, g, dim=0):
    acc = float_compute(v.dtype)
    vf = v.astype(acc)
    norms = jnp.sqrt(jnp.square(vf).sum(_norm_axes(v, dim), keepdims=True))
    return vf * (g.astype(acc) / norms), norms


@xla("aten::_weight_norm_interface_backward")
def _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    acc = float_compute(saved_v.dtype)
    gw, v, g, norms = (t.astype(acc) for t in (grad_w, saved_v, saved_g, saved_norms))
    norms = norms.reshape(g.shape)
    grad_g = (gw * v).sum(_norm_axes(v, dim), keepdims=True) / norms
    grad_v = (g / norms) * (gw - v * (grad_g / norms))
    return grad_v, grad_g
