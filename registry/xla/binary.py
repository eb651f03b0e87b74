"""Binary elementwise lowerings from one table: atan2, hypot, copysign, nextafter, xlogy,
heaviside, logaddexp(2), maximum/minimum, fmax/fmin, gcd/lcm, bitwise and/or/xor and
shifts (and their ``__and__``... spellings), ldexp.

``binary_core(name)`` takes the result dtype explicitly (the ``_foreach_*`` lowerings
reuse it); half types compute in float32, except nextafter, which needs the half type.
"""
from __future__ import annotations

import math
from typing import Callable

import jax.numpy as jnp
import numpy as np
import torch

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import check_kernel_dtype
from tpu_kernels.registry.xla._util import as_dtype, float_compute, is_bool


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
    return lambda a, b: fn_bool(a, b) if is_bool(a.dtype) else fn_int(a, b)


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
    core = _binary_float(BINARY[name], native=name == "nextafter")

    def checked(x, y, dt):
        check_kernel_dtype(name, dt)  # before the compute cast: the error names the dtype
        return core(x, y, dt)
    return checked


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
