"""Unary elementwise lowerings: float math (exp, log, trig, erf, lgamma...), ops that keep
the input's dtype (neg, abs, sign, rounding, isnan...), round.decimals, nan_to_num, logit,
conj_physical, frexp.

``unary_core(name)`` takes the result dtype explicitly, so the ``_foreach_*`` lowerings
reuse it per list element. Half types compute in float32, as torch's CPU kernels do.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import jax.scipy.special
from jax import lax

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import check_kernel_dtype
from tpu_kernels.registry.xla._util import as_dtype, float_compute, is_bool, is_int


def _deg(x):
    return x * (180.0 / math.pi)


def _rad(x):
    return x * (math.pi / 180.0)


def _angle(x):
    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(math.pi, x.dtype), jnp.zeros_like(x)))


def _digamma(x):
    # torch: digamma(+-0) = -+inf
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), jax.scipy.special.digamma(x))


# float results (int inputs promote to the default float), computed in float32 for half types
UNARY_FLOAT: dict[str, Callable] = {
    "exp": jnp.exp, "exp2": jnp.exp2, "expm1": jnp.expm1, "log": jnp.log, "log2": jnp.log2,
    "log10": jnp.log10, "log1p": jnp.log1p, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt,
    "reciprocal": lambda x: 1 / x, "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan,
    "asin": jnp.arcsin, "acos": jnp.arccos, "atan": jnp.arctan, "sinh": jnp.sinh,
    "cosh": jnp.cosh, "asinh": jnp.arcsinh, "acosh": jnp.arccosh, "atanh": jnp.arctanh,
    "sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh, "erf": lax.erf, "erfc": lax.erfc,
    "erfinv": lax.erf_inv, "sinc": jnp.sinc, "deg2rad": _rad, "rad2deg": _deg, "angle": _angle,
    "lgamma": jax.scipy.special.gammaln, "digamma": _digamma, "i0": jax.scipy.special.i0,
}


def _keep_int(fn):
    """Rounding ops are the identity on integer tensors."""
    return lambda x: x if is_int(x.dtype) else fn(x)


def _sign(x):
    if is_bool(x.dtype) or jnp.iscomplexobj(x):
        return x if is_bool(x.dtype) else jnp.sign(x)
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)  # nan -> 0, as torch


def _frac(x):
    return x - jnp.trunc(x)


# results in the input's dtype (or bool), computed in float32 for half types
UNARY_SAME: dict[str, Callable] = {
    "neg": jnp.negative, "abs": jnp.abs, "sign": _sign, "sgn": _sign,
    "ceil": _keep_int(jnp.ceil), "floor": _keep_int(jnp.floor), "trunc": _keep_int(jnp.trunc),
    "round": _keep_int(jnp.round), "frac": _frac,
    "bitwise_not": lambda x: jnp.logical_not(x) if is_bool(x.dtype) else jnp.invert(x),
    "logical_not": lambda x: x == 0, "isnan": jnp.isnan, "isinf": jnp.isinf,
    "isposinf": jnp.isposinf, "isneginf": jnp.isneginf, "isfinite": jnp.isfinite,
    "signbit": jnp.signbit,
}

UNARY: dict[str, Callable] = {**UNARY_FLOAT, **UNARY_SAME}


def unary_core(name: str) -> Callable[[jax.Array, Any], jax.Array]:
    """``core(x, dt)``: op ``name`` on ``x``, result in ``dt``."""
    fn = UNARY[name]
    keep_input = name in UNARY_SAME  # bool results must see the input's own dtype

    def core(x, dt):
        check_kernel_dtype(name, dt)
        # a complex input keeps its dtype (angle's result is real: casting the input to it
        # first would drop the imaginary part)
        cd = float_compute(x.dtype if keep_input or jnp.iscomplexobj(x) else dt)
        return fn(x.astype(cd)).astype(dt)
    return core


def _register_unary(name: str) -> None:
    core = unary_core(name)
    overload = "aten::isinf" if name == "isinf" else f"aten::{name}"
    xla(overload, name=name)(lambda x: core(x, out_dtype()))


for _name in UNARY:
    _register_unary(_name)


@xla("aten::round.decimals")
def round_decimals(x, *, decimals: int):
    dt = out_dtype()
    if is_int(dt):
        return x
    cd = float_compute(dt)
    # as torch: scale by 10**|decimals|, round half to even, unscale
    p = jnp.asarray(10.0 ** abs(decimals), cd)
    x = x.astype(cd)
    y = jnp.round(x / p) * p if decimals < 0 else jnp.round(x * p) / p
    return y.astype(dt)


@xla("aten::nan_to_num")
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    dt = out_dtype()
    if is_int(dt):
        return x
    info = jnp.finfo(dt)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    y = jnp.where(jnp.isnan(x), as_dtype(nan, dt), x)
    return jnp.where(jnp.isposinf(x), as_dtype(posinf, dt), jnp.where(jnp.isneginf(x), as_dtype(neginf, dt), y))


@xla("aten::logit")
def logit(x, eps=None):
    """log(z / (1 - z)), z clamped to [eps, 1 - eps]. torch's CPU kernel works in the input's
    own type, so for half types eps, 1 - eps, 1 - z and the quotient are each rounded to it."""
    dt = out_dtype()
    cd = float_compute(dt)

    def rnd(v):
        return v.astype(dt).astype(cd) if cd != dt else v
    z = x.astype(cd)
    if eps is not None:
        lo = rnd(jnp.asarray(eps, cd))
        z = jnp.clip(z, lo, rnd(1 - lo))
    return jnp.log(rnd(z / rnd(1 - z))).astype(dt)


@xla("aten::_conj_physical", "aten::conj_physical")
def conj_physical(x):
    """The conjugate as a new tensor (real tensors: a copy); torch's lazy conj bit is
    materialised by the dispatcher."""
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@xla("aten::frexp.Tensor")
def frexp(x):
    m, e = jnp.frexp(x)
    finite = jnp.isfinite(x)  # torch: non-finite inputs give themselves and exponent 0
    return jnp.where(finite, m, x), jnp.where(finite, e, 0).astype(out_dtype(1))
