"""Activation functions and their backward ops, with torch's CPU formulas (so values
match at the kinks and in the saturated tails). Computed in float32 for half types.
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from tpu_kernels.registry.context import out_dtype, rng_key
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import as_dtype, float_compute

_SQRT1_2 = 1 / math.sqrt(2)
_GELU_PDF = 1 / math.sqrt(2 * math.pi)  # M_2_SQRTPI * M_SQRT1_2 * 0.5
_GELU_BETA = math.sqrt(2 / math.pi)
_GELU_KAPPA = 0.044715


def _act(fn: Callable) -> Callable:
    """Wrap ``fn(*arrays_and_scalars)``: tensors cast to the compute dtype, result to torch's."""
    def lower(*args, **kwargs):
        dt = out_dtype()
        cd = float_compute(dt)
        args = [a.astype(cd) if hasattr(a, "astype") and not _is_flag(a) else a for a in args]
        return fn(*args, cd=cd, **kwargs).astype(dt)
    lower.__name__ = fn.__name__
    return lower


def _is_flag(a) -> bool:
    return isinstance(a, (bool, str))


def _zero(x):
    return jnp.zeros_like(x)


# -- relu family -------------------------------------------------------------------------------
@xla("aten::relu")
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype)).astype(out_dtype())


@xla("aten::threshold")
@_act
def threshold(x, threshold, value, *, cd):
    return jnp.where(x <= as_dtype(threshold, cd), as_dtype(value, cd), x)


@xla("aten::threshold_backward")
@_act
def threshold_backward(grad, x, threshold, *, cd):
    return jnp.where(x <= as_dtype(threshold, cd), _zero(grad), grad)


@xla("aten::hardtanh")
@_act
def hardtanh(x, min_val=-1, max_val=1, *, cd):
    return jnp.minimum(jnp.maximum(x, as_dtype(min_val, cd)), as_dtype(max_val, cd))


@xla("aten::hardtanh_backward")
@_act
def hardtanh_backward(grad, x, min_val, max_val, *, cd):
    outside = (x <= as_dtype(min_val, cd)) | (x >= as_dtype(max_val, cd))
    return jnp.where(outside, _zero(grad), grad)


@xla("aten::leaky_relu")
@_act
def leaky_relu(x, negative_slope=0.01, *, cd):
    return jnp.where(x > 0, x, x * as_dtype(negative_slope, cd))


@xla("aten::leaky_relu_backward")
@_act
def leaky_relu_backward(grad, x, negative_slope, self_is_result, *, cd):
    return jnp.where(x > 0, grad, grad * as_dtype(negative_slope, cd))


def _elu(x, alpha, scale, input_scale, cd):
    neg = jnp.expm1(x * as_dtype(input_scale, cd)) * as_dtype(alpha, cd) * as_dtype(scale, cd)
    return jnp.where(x <= 0, neg, x * as_dtype(scale, cd))


@xla("aten::elu")
@_act
def elu(x, alpha=1, scale=1, input_scale=1, *, cd):
    return _elu(x, alpha, scale, input_scale, cd)


@xla("aten::celu")
@_act
def celu(x, alpha=1.0, *, cd):
    return _elu(x, alpha, 1.0, 1.0 / as_dtype(alpha, cd), cd)


@xla("aten::elu_backward")
@_act
def elu_backward(grad, alpha, scale, input_scale, is_result: bool, self_or_result, *, cd):
    negcoef = as_dtype(alpha, cd) * as_dtype(scale, cd)
    poscoef, negiptcoef = as_dtype(scale, cd), as_dtype(input_scale, cd)
    x = self_or_result
    if is_result:  # x is the forward's output: exp(..) * negcoef = x + negcoef
        neg = grad * negiptcoef * (x + negcoef)
    else:
        neg = grad * negiptcoef * negcoef * jnp.exp(x * negiptcoef)
    return jnp.where(x <= 0, neg, grad * poscoef)


@xla("aten::_prelu_kernel")
@_act
def prelu(x, weight, *, cd):
    return jnp.where(x > 0, x, weight * x)


@xla("aten::_prelu_kernel_backward")
def prelu_backward(grad, x, weight):
    cd = float_compute(out_dtype(0))
    g, x, w = grad.astype(cd), x.astype(cd), weight.astype(cd)
    pos = x > 0
    gi = jnp.where(pos, g, w * g)
    gw = jnp.where(pos, _zero(g), x * g)
    return gi.astype(out_dtype(0)), gw.astype(out_dtype(1))


def _rrelu_eval(x, lower, upper, cd):
    slope = (as_dtype(lower, cd) + as_dtype(upper, cd)) / 2
    return jnp.where(x > 0, x, x * slope)


def _rrelu(x, noise, lower, upper, training: bool):
    """(output, new noise): slopes drawn uniformly in [lower, upper) for x <= 0 when training."""
    dt = out_dtype()
    cd = float_compute(dt)
    xc = x.astype(cd)
    if not training:
        return _rrelu_eval(xc, lower, upper, cd).astype(dt), noise
    lo, hi = as_dtype(lower, cd), as_dtype(upper, cd)
    r = jax.random.uniform(rng_key(), x.shape, cd, 0.0, 1.0) * (hi - lo) + lo
    neg = xc <= 0
    out = jnp.where(neg, xc * r, xc)
    new_noise = jnp.where(neg, r, jnp.ones_like(r))
    return out.astype(dt), new_noise.astype(noise.dtype)


@xla("aten::rrelu_with_noise", random=True)
def rrelu_with_noise(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    return _rrelu(x, noise, lower, upper, training)


@xla("aten::rrelu_with_noise_functional", random=True)
def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    return _rrelu(x, noise, lower, upper, training)


@xla("aten::rrelu_with_noise_backward")
@_act
def rrelu_with_noise_backward(grad, x, noise, lower, upper, training: bool, self_is_result: bool, *, cd):
    lo, hi = as_dtype(lower, cd), as_dtype(upper, cd)
    slope_grad = jnp.where(x > 0, grad, grad * (lo + hi) / 2)
    if not training:
        return slope_grad
    return jnp.where(hi - lo > 1e-6, grad * noise, slope_grad)


# -- smooth activations ---------------------------------------------------------------------------
@xla("aten::gelu")
@_act
def gelu(x, *, approximate: str = "none", cd):
    if approximate == "tanh":
        inner = _GELU_BETA * (x + _GELU_KAPPA * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return x * 0.5 * (1 + lax.erf(x * _SQRT1_2))


@xla("aten::gelu_backward")
@_act
def gelu_backward(grad, x, *, approximate: str = "none", cd):
    if approximate == "tanh":
        x_sq = x * x
        t = jnp.tanh(_GELU_BETA * (x + _GELU_KAPPA * x_sq * x))
        left_d = 0.5 * (1 + t)
        right_d = 0.5 * x * (1 - t * t) * _GELU_BETA * (1 + 3 * _GELU_KAPPA * x_sq)
        return grad * (left_d + right_d)
    cdf = 0.5 * (1 + lax.erf(x * _SQRT1_2))
    pdf = jnp.exp(-0.5 * x * x) * _GELU_PDF
    return grad * (cdf + x * pdf)


@xla("aten::silu")
@_act
def silu(x, *, cd):
    return x / (1 + jnp.exp(-x))


@xla("aten::silu_backward")
@_act
def silu_backward(grad, x, *, cd):
    s = 1 / (1 + jnp.exp(-x))
    return grad * s * (1 + x * (1 - s))


@xla("aten::mish")
@_act
def mish(x, *, cd):
    return x * jnp.tanh(jnp.log1p(jnp.exp(x)))


@xla("aten::mish_backward")
@_act
def mish_backward(grad, x, *, cd):
    s = 1 / (1 + jnp.exp(-x))
    t = jnp.tanh(jnp.log1p(jnp.exp(x)))
    return grad * (t + x * s * (1 - t * t))


@xla("aten::softplus")
@_act
def softplus(x, beta=1, threshold=20, *, cd):
    b = as_dtype(beta, cd)
    return jnp.where(x * b > as_dtype(threshold, cd), x, jnp.log1p(jnp.exp(x * b)) / b)


@xla("aten::softplus_backward")
@_act
def softplus_backward(grad, x, beta, threshold, *, cd):
    z = jnp.exp(x * as_dtype(beta, cd))
    return jnp.where(x * as_dtype(beta, cd) > as_dtype(threshold, cd), grad, grad * z / (z + 1))


@xla("aten::sigmoid_backward")
@_act
def sigmoid_backward(grad, output, *, cd):
    return grad * (1 - output) * output


@xla("aten::tanh_backward")
@_act
def tanh_backward(grad, output, *, cd):
    return grad * (1 - output * output)


@xla("aten::log_sigmoid_forward")
def log_sigmoid_forward(x):
    """(output, buffer) as torch's CPU kernel: buffer = exp(-|x|)."""
    cd = float_compute(out_dtype(0))
    xc = x.astype(cd)
    z = jnp.exp(-jnp.abs(xc))
    return (jnp.minimum(xc, 0) - jnp.log1p(z)).astype(out_dtype(0)), z.astype(out_dtype(1))


@xla("aten::log_sigmoid_backward")
@_act
def log_sigmoid_backward(grad, x, buffer, *, cd):
    z = jnp.exp(-jnp.abs(x))  # recomputed: the buffer may be empty (other backends' forward)
    neg = x < 0
    return grad * (jnp.where(neg, 1.0, 0.0).astype(cd) - jnp.where(neg, 1.0, -1.0).astype(cd) * (z / (1 + z)))


# -- hard activations, shrinkage ---------------------------------------------------------------------
@xla("aten::hardsigmoid")
@_act
def hardsigmoid(x, *, cd):
    return jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6


@xla("aten::hardsigmoid_backward")
@_act
def hardsigmoid_backward(grad, x, *, cd):
    return jnp.where((x > -3) & (x < 3), grad / 6, _zero(grad))


@xla("aten::hardswish")
@_act
def hardswish(x, *, cd):
    return x * jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6


@xla("aten::hardswish_backward")
@_act
def hardswish_backward(grad, x, *, cd):
    return jnp.where(x <= -3, _zero(grad), jnp.where(x < 3, grad * (x / 3 + 0.5), grad))


def _inside(x, lambd, cd):
    lam = as_dtype(lambd, cd)
    return (x >= -lam) & (x <= lam)


@xla("aten::hardshrink")
@_act
def hardshrink(x, lambd=0.5, *, cd):
    return jnp.where(_inside(x, lambd, cd), _zero(x), x)


@xla("aten::softshrink")
@_act
def softshrink(x, lambd=0.5, *, cd):
    lam = as_dtype(lambd, cd)
    return jnp.where(x > lam, x - lam, jnp.where(x < -lam, x + lam, _zero(x)))


@xla("aten::hardshrink_backward", "aten::softshrink_backward")
@_act
def shrink_backward(grad, x, lambd, *, cd):
    return jnp.where(_inside(x, lambd, cd), _zero(grad), grad)


# -- glu ------------------------------------------------------------------------------------------
def _glu(x, dim: int):
    a, b = jnp.split(x, 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@xla("aten::glu")
@_act
def glu(x, dim=-1, *, cd):
    return _glu(x, dim)


@xla("aten::glu_backward")
@_act
def glu_backward(grad, x, dim, *, cd):
    return jax.vjp(lambda v: _glu(v, dim), x)[1](grad)[0]
