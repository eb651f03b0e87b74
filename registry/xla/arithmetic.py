"""Arithmetic lowerings: add, sub, rsub, mul, div (with rounding modes), floor_divide,
remainder, fmod, pow, float_power.

Each op's math is a ``*_core`` function that takes the result dtype explicitly, so the
``_foreach_*`` lowerings reuse it per list element. Results are computed in the dtype
torch computes in (the promoted dtype; float32 for half types, as torch's CPU kernels
do) and cast to torch's result dtype.
"""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from tpu_kernels.registry.context import check, out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.kinds import DEFAULT_PRIORITY
from tpu_kernels.registry.xla._util import as_dtype, float_compute, is_bool, is_int


def _unit(alpha: Any) -> bool:
    """``alpha`` is the untraced default 1: skip the multiply."""
    return isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha == 1


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
    elif is_int(cd):
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
    if is_int(cd):
        _no_int_zero_division(b)
    m = lax.rem(a, b)
    return jnp.where((m != 0) & ((m < 0) != (b < 0)), m + b, m).astype(dt)


def fmod_core(x, y, dt):
    _no_bool("fmod", dt)
    cd = float_compute(dt)
    a, b = _same_shape(as_dtype(x, cd), as_dtype(y, cd))
    if is_int(cd):
        _no_int_zero_division(b)
    return lax.rem(a, b).astype(dt)


def pow_core(x, e, dt):
    """``x ** e``; exponents 2, 3, 0.5, -0.5, -1, -2 take torch's exact special paths."""
    cd = float_compute(dt)
    x, e = _same_shape(as_dtype(x, cd), as_dtype(e, cd))
    if is_bool(cd):
        return (x | ~e).astype(dt)
    if is_int(cd):
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


def _int_base_int_exponent(x: Any, exponent: Any) -> bool | str:
    """torch refuses an integer tensor to a negative Python int by the exponent's value; only
    these calls key on it (static), so a float tensor's new exponent never retraces."""
    if x.dtype.is_floating_point or x.dtype.is_complex or type(exponent) is not int:
        return "not an integer tensor to a Python int power"
    return True


@xla("aten::pow.Tensor_Scalar", static=("exponent",), supports=_int_base_int_exponent,
     priority=DEFAULT_PRIORITY["xla"] + 1)
def pow_int_scalar(x, exponent: int):
    if exponent < 0:
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    return pow_core(x, exponent, out_dtype())


@xla("aten::pow.Tensor_Tensor", "aten::pow.Tensor_Scalar", "aten::pow.Scalar")
def pow_(x, exponent):
    return pow_core(x, exponent, out_dtype())


@xla("aten::float_power.Tensor_Tensor", "aten::float_power.Tensor_Scalar", "aten::float_power.Scalar")
def float_power(x, exponent):
    return pow_core(x, exponent, out_dtype())


@xla("aten::floor_divide_.Tensor", "aten::floor_divide_.Scalar")
def floor_divide_(x, other):
    # the in-place overloads are named differently from the functional ones: no derivation
    return div_core(x, other, out_dtype(), "floor")
