"""Elementwise lowerings: unary math, binary arithmetic, comparisons, bitwise and logical
ops, where, clamp, lerp, addcmul/addcdiv.

Each op's math lives in a ``*_core`` function (or a table entry) that takes the result
dtype explicitly, so the ``_foreach_*`` lowerings reuse it per list element. Results are
computed in the dtype torch computes in (the promoted dtype; float32 for half types,
as torch's CPU kernels do) and cast to torch's result dtype.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
import torch
from jax import lax

from tpu_kernels.registry.context import check, out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import as_dtype, compute_dtype, float_compute


def _is_int(dt) -> bool:
    return jnp.issubdtype(dt, jnp.integer) or np.dtype(dt) == np.bool_


def _is_bool(dt) -> bool:
    return np.dtype(dt) == np.bool_


def _unit(alpha: Any) -> bool:
    """``alpha`` is the untraced default 1: skip the multiply."""
    return isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha == 1


# -- unary ---------------------------------------------------------------------------------
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
    return lambda x: x if _is_int(x.dtype) else fn(x)


def _sign(x):
    if _is_bool(x.dtype) or jnp.iscomplexobj(x):
        return x if _is_bool(x.dtype) else jnp.sign(x)
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)  # nan -> 0, as torch


def _frac(x):
    return x - jnp.trunc(x)


# results in the input's dtype (or bool), computed in float32 for half types
UNARY_SAME: dict[str, Callable] = {
    "neg": jnp.negative, "abs": jnp.abs, "sign": _sign, "sgn": _sign,
    "ceil": _keep_int(jnp.ceil), "floor": _keep_int(jnp.floor), "trunc": _keep_int(jnp.trunc),
    "round": _keep_int(jnp.round), "frac": _frac,
    "bitwise_not": lambda x: jnp.logical_not(x) if _is_bool(x.dtype) else jnp.invert(x),
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
    if _is_int(dt):
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
    if _is_int(dt):
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


# -- arithmetic --------------------------------------------------------------------------------
def add_core(x, y, alpha, dt):
    cd = float_compute(dt)
    y = as_dtype(y, cd)
    if not _unit(alpha):
        y = y * as_dtype(alpha, cd)
    return (as_dtype(x, cd) + y).astype(dt)


def sub_core(x, y, alpha, dt):
    cd = float_compute(dt)
    y = as_dtype(y, cd)
    if not _unit(alpha):
        y = y * as_dtype(alpha, cd)
    return (as_dtype(x, cd) - y).astype(dt)


def mul_core(x, y, dt):
    cd = float_compute(dt)
    return (as_dtype(x, cd) * as_dtype(y, cd)).astype(dt)


def _floor_div_float(a, b, r):
    """Python-style floor division on floats, torch's algorithm (exact for representable
    quotients, ``a / b`` for ``b == 0``); ``r`` rounds each intermediate to the result
    dtype, as torch's half-type kernels do."""
    mod = r(lax.rem(a, b))
    div = r(r(a - mod) / b)
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), r(div - 1), div)
    fl = jnp.floor(div)
    fl = jnp.where(r(div - fl) > 0.5, r(fl + 1), fl)
    q = a / b
    fl = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(q), q), fl)
    return jnp.where(b == 0, q, fl)


def _floor_div_int(a, b):
    q = lax.div(a, b)
    r = lax.rem(a, b)
    return jnp.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


def _same_shape(a, b):
    """lax's binary ops do not broadcast: torch's operands do."""
    if jnp.shape(a) != jnp.shape(b):
        return jnp.broadcast_arrays(a, b)
    return a, b


def div_core(x, y, dt, rounding_mode=None):
    cd = float_compute(dt)
    a, b = as_dtype(x, cd), as_dtype(y, cd)
    if rounding_mode is not None:
        a, b = _same_shape(a, b)
    if rounding_mode is None:
        q = a / b
    elif _is_int(cd):
        _no_int_zero_division(b)
        q = lax.div(a, b) if rounding_mode == "trunc" else _floor_div_int(a, b)
    else:
        r = (lambda v: v.astype(dt).astype(cd)) if cd != dt else (lambda v: v)
        q = jnp.trunc(r(a / b)) if rounding_mode == "trunc" else _floor_div_float(a, b, r)
    return q.astype(dt)


def _no_int_zero_division(b) -> None:
    """Integer division by zero raises in torch; XLA returns garbage (checked, deferred)."""
    check(b != 0, "ZeroDivisionError", RuntimeError)  # torch: RuntimeError("ZeroDivisionError")


def _no_bool(name: str, dt) -> None:
    if np.dtype(dt) == np.bool_:
        raise NotImplementedError(f"{name}: not implemented for 'Bool'")


def remainder_core(x, y, dt):
    _no_bool("remainder", dt)
    cd = float_compute(dt)
    a, b = as_dtype(x, cd), as_dtype(y, cd)
    a, b = _same_shape(a, b)
    if _is_int(cd):
        _no_int_zero_division(b)
    m = lax.rem(a, b)
    return jnp.where((m != 0) & ((m < 0) != (b < 0)), m + b, m).astype(dt)


def fmod_core(x, y, dt):
    _no_bool("fmod", dt)
    cd = float_compute(dt)
    a, b = _same_shape(as_dtype(x, cd), as_dtype(y, cd))
    if _is_int(cd):
        _no_int_zero_division(b)
    return lax.rem(a, b).astype(dt)


def pow_core(x, e, dt):
    """``x ** e``; exponents 2, 3, 0.5, -0.5, -1, -2 take torch's exact special paths."""
    cd = float_compute(dt)
    x, e = _same_shape(as_dtype(x, cd), as_dtype(e, cd))
    if _is_bool(cd):
        return (x | ~e).astype(dt)
    if _is_int(cd):
        return _int_pow(x, e).astype(dt)
    if jnp.iscomplexobj(x):
        return lax.pow(x, e).astype(dt)
    sq = x * x
    y = jnp.select(
        [e == 2, e == 3, e == 0.5, e == -0.5, e == -1, e == -2],
        [sq, sq * x, jnp.sqrt(x), lax.rsqrt(x), 1 / x, 1 / sq], lax.pow(x, e))
    return y.astype(dt)


def _int_pow(x, e):
    """Exact integer power by squaring; negative exponents as torch (0 unless |x| == 1)."""
    bits = np.dtype(x.dtype).itemsize * 8
    ne = jnp.maximum(e, 0)

    def step(i, carry):
        acc, base = carry
        bit = (ne >> i) & 1
        return jnp.where(bit == 1, acc * base, acc), base * base
    acc, _ = lax.fori_loop(0, bits - 1, step, (jnp.ones_like(x * e), x + jnp.zeros_like(e)))
    neg = jnp.where(x == 1, 1, jnp.where(x == -1, jnp.where(e % 2 == 0, 1, -1), 0)).astype(acc.dtype)
    return jnp.where(e < 0, neg, acc)


def _binary_float(fn, native: bool = False):
    """A binary op computed in the result dtype (f32 for halves, unless ``native``)."""
    def core(x, y, dt):
        cd = dt if native else float_compute(dt)
        return fn(as_dtype(x, cd), as_dtype(y, cd)).astype(dt)
    return core


def _heaviside(x, v):
    return jnp.where(x == 0, v, (x > 0).astype(x.dtype))


def _xlogy(x, y):
    return jnp.where(jnp.isnan(y), y, jnp.where(x == 0, jnp.zeros_like(x), x * jnp.log(y)))


def _xlog1py(x, y):
    return jnp.where(jnp.isnan(y), y, jnp.where(x == 0, jnp.zeros_like(x), x * jnp.log1p(y)))


def _logaddexp(a, b):
    m = jnp.maximum(a, b)
    # equal infinities: a + log(2) would give nan for -inf; torch returns the infinity
    return jnp.where(jnp.isinf(m) & (a == b), a, m + jnp.log1p(jnp.exp(-jnp.abs(a - b))))


def _logaddexp2(a, b):
    m = jnp.maximum(a, b)
    return jnp.where(jnp.isinf(m) & (a == b), a, m + jnp.log1p(jnp.exp2(-jnp.abs(a - b))) / math.log(2))


def _gcd(a, b):
    return jnp.gcd(a, b)


def _lcm(a, b):
    g = jnp.gcd(a, b)
    return jnp.where(g == 0, jnp.zeros_like(g), jnp.abs(a // jnp.where(g == 0, 1, g) * b))


def _shift_left(a, b):
    bits = np.dtype(a.dtype).itemsize * 8
    return jnp.where((b < 0) | (b >= bits), jnp.zeros_like(a), jnp.left_shift(a, jnp.clip(b, 0, bits - 1)))


def _shift_right(a, b):
    bits = np.dtype(a.dtype).itemsize * 8
    out_of_range = (b < 0) | (b >= bits)
    if jnp.issubdtype(a.dtype, jnp.unsignedinteger):
        return jnp.where(out_of_range, jnp.zeros_like(a), jnp.right_shift(a, jnp.where(out_of_range, 0, b)))
    return jnp.right_shift(a, jnp.where(out_of_range, bits - 1, b).astype(a.dtype))  # sign fill


def _bool_or_int(fn_bool, fn_int):
    return lambda a, b: fn_bool(a, b) if _is_bool(a.dtype) else fn_int(a, b)


# binary ops computed in the result dtype
BINARY: dict[str, Callable] = {
    "atan2": jnp.arctan2, "hypot": jnp.hypot, "copysign": jnp.copysign,
    "nextafter": jnp.nextafter, "xlogy": _xlogy, "special_xlog1py": _xlog1py,
    "heaviside": _heaviside, "logaddexp": _logaddexp, "logaddexp2": _logaddexp2,
    "maximum": jnp.maximum, "minimum": jnp.minimum, "fmax": jnp.fmax, "fmin": jnp.fmin,
    "gcd": _gcd, "lcm": _lcm,
    "bitwise_and": _bool_or_int(jnp.logical_and, jnp.bitwise_and),
    "bitwise_or": _bool_or_int(jnp.logical_or, jnp.bitwise_or),
    "bitwise_xor": _bool_or_int(jnp.logical_xor, jnp.bitwise_xor),
    "bitwise_left_shift": _shift_left, "bitwise_right_shift": _shift_right,
    "ldexp": lambda x, e: x * jnp.exp2(e),
}


def binary_core(name: str) -> Callable:
    return _binary_float(BINARY[name], native=name == "nextafter")


def _register_binary(name: str, core: Callable) -> None:
    """Every tensor-returning overload (Tensor, Scalar, Scalar_Tensor ...) of ``name``."""
    p = getattr(torch.ops.aten, name)
    ops = [f"aten::{name}.{o}" for o in p.overloads() if "out" not in o.lower() and _tensor_schema(p, o)]
    xla(*ops, name=name)(lambda x, other: core(x, other, out_dtype()))


def _tensor_schema(packet, overload: str) -> bool:
    """An overload that returns a tensor (not the int/float scalar overloads)."""
    rets = getattr(packet, overload)._schema.returns
    return len(rets) == 1 and str(rets[0].type) == "Tensor" and rets[0].alias_info is None


for _name in BINARY:
    _register_binary(_name, binary_core(_name))
for _name, _core in (("__lshift__", "bitwise_left_shift"), ("__rshift__", "bitwise_right_shift"),
                     ("__and__", "bitwise_and"), ("__or__", "bitwise_or"), ("__xor__", "bitwise_xor")):
    _register_binary(_name, binary_core(_core))


@xla("aten::add.Tensor", "aten::add.Scalar")
def add(x, other, alpha=1):
    return add_core(x, other, alpha, out_dtype())


def _no_bool_sub(*operands) -> None:
    """torch refuses ``-`` with any bool operand; its meta function only when both are."""
    if any(isinstance(v, bool) or getattr(v, "dtype", None) == jnp.bool_ for v in operands):
        raise RuntimeError("sub: Subtraction, the `-` operator, with a bool tensor is not supported. "
                           "If you are trying to invert a mask, use the `~` or `logical_not()` "
                           "operator instead.")


@xla("aten::sub.Tensor", "aten::sub.Scalar")
def sub(x, other, alpha=1):
    _no_bool_sub(x, other)
    return sub_core(x, other, alpha, out_dtype())


@xla("aten::rsub.Tensor", "aten::rsub.Scalar")
def rsub(x, other, alpha=1):
    _no_bool_sub(x, other)
    return sub_core(other, x, alpha, out_dtype())


@xla("aten::mul.Tensor", "aten::mul.Scalar")
def mul(x, other):
    return mul_core(x, other, out_dtype())


@xla("aten::mul.out")
def mul_out(x, other, *, out):
    # DDP's reducer scales each gradient into its bucket with it
    return mul_core(x, other, out_dtype())


@xla("aten::div.Tensor", "aten::div.Scalar", "aten::div.Tensor_mode", "aten::div.Scalar_mode")
def div(x, other, *, rounding_mode=None):
    return div_core(x, other, out_dtype(), rounding_mode)


@xla("aten::floor_divide", "aten::floor_divide.Scalar")
def floor_divide(x, other):
    return div_core(x, other, out_dtype(), "floor")


@xla("aten::remainder.Tensor", "aten::remainder.Scalar", "aten::remainder.Scalar_Tensor")
def remainder(x, other):
    return remainder_core(x, other, out_dtype())


@xla("aten::fmod.Tensor", "aten::fmod.Scalar")
def fmod(x, other):
    return fmod_core(x, other, out_dtype())


@xla("aten::pow.Tensor_Tensor", "aten::pow.Tensor_Scalar", "aten::pow.Scalar")
def pow_(x, exponent):
    return pow_core(x, exponent, out_dtype())


@xla("aten::float_power.Tensor_Tensor", "aten::float_power.Tensor_Scalar", "aten::float_power.Scalar")
def float_power(x, exponent):
    return pow_core(x, exponent, out_dtype())


# -- comparisons and logical ops ------------------------------------------------------------------
_COMPARE = {"eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
            "gt": jnp.greater, "ge": jnp.greater_equal}


def compare_core(name: str) -> Callable:
    fn = _COMPARE[name]

    def core(x, other, dt=None):
        cd = compute_dtype(x, other)  # compare in the promoted type, as torch does
        return fn(as_dtype(x, cd), as_dtype(other, cd))
    return core


for _name in _COMPARE:
    xla(f"aten::{_name}.Tensor", f"aten::{_name}.Scalar", name=_name)(
        (lambda core: lambda x, other: core(x, other))(compare_core(_name)))


_LOGICAL = {"logical_and": jnp.logical_and, "logical_or": jnp.logical_or, "logical_xor": jnp.logical_xor}

for _name, _fn in _LOGICAL.items():
    xla(f"aten::{_name}", name=_name)(
        (lambda fn: lambda x, other: fn(x != 0, other != 0))(_fn))


# -- selection and clamping --------------------------------------------------------------------------
@xla("aten::where.self", "aten::where.ScalarSelf", "aten::where.ScalarOther", "aten::where.Scalar")
def where(cond, x, other):
    dt = out_dtype()
    return jnp.where(cond.astype(bool), as_dtype(x, dt), as_dtype(other, dt))


def clamp_core(x, lo, hi, dt):
    cd = float_compute(dt)
    y = x.astype(cd)
    if lo is not None:
        y = jnp.maximum(y, as_dtype(lo, cd))
    if hi is not None:
        y = jnp.minimum(y, as_dtype(hi, cd))
    return y.astype(dt)


@xla("aten::clamp", "aten::clamp.Tensor")
def clamp(x, min=None, max=None):  # noqa: A002  (schema names)
    return clamp_core(x, min, max, out_dtype())


@xla("aten::clamp_min", "aten::clamp_min.Tensor")
def clamp_min(x, min):  # noqa: A002
    return clamp_core(x, min, None, out_dtype())


@xla("aten::clamp_max", "aten::clamp_max.Tensor")
def clamp_max(x, max):  # noqa: A002
    return clamp_core(x, None, max, out_dtype())


def lerp_core(x, end, w, dt):
    """torch's two-sided formula: exact at both ends, ``w < 0.5`` from ``x``, else from ``end``."""
    cd = float_compute(dt)
    x, end, w = x.astype(cd), end.astype(cd), as_dtype(w, cd)
    d = end - x
    return jnp.where(jnp.abs(w) < 0.5, x + w * d, end - d * (1 - w)).astype(dt)


@xla("aten::lerp.Scalar", "aten::lerp.Tensor")
def lerp(x, end, weight):
    return lerp_core(x, end, weight, out_dtype())


def addcmul_core(x, t1, t2, value, dt):
    cd = float_compute(dt)
    v = as_dtype(value, cd)
    return (x.astype(cd) + v * t1.astype(cd) * t2.astype(cd)).astype(dt)


def addcdiv_core(x, t1, t2, value, dt):
    cd = float_compute(dt)
    v = as_dtype(value, cd)
    return (x.astype(cd) + v * t1.astype(cd) / t2.astype(cd)).astype(dt)


@xla("aten::addcmul")
def addcmul(x, tensor1, tensor2, *, value=1):
    return addcmul_core(x, tensor1, tensor2, value, out_dtype())


@xla("aten::addcdiv")
def addcdiv(x, tensor1, tensor2, *, value=1):
    return addcdiv_core(x, tensor1, tensor2, value, out_dtype())


@xla("aten::floor_divide_.Tensor", "aten::floor_divide_.Scalar")
def floor_divide_(x, other):
    # the in-place overloads are named differently from the functional ones: no derivation
    return div_core(x, other, out_dtype(), "floor")


@xla("aten::atan2.out")
def atan2_out(x, other, *, out):
    return binary_core("atan2")(x, other, out_dtype())
