"""Elementwise lowerings: unary math, binary arithmetic, comparisons, where, clamp."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import as_dtype, compute_dtype, float_compute


def _unary_float(fn):
    """A float op computed in float32 for half types, result in torch's dtype."""
    def lower(x):
        dt = out_dtype()
        return fn(x.astype(float_compute(dt))).astype(dt)
    return lower


_UNARY_FLOAT = {
    "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt, "rsqrt": jax.lax.rsqrt, "sin": jnp.sin,
    "cos": jnp.cos, "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid, "erf": jax.lax.erf,
    "log1p": jnp.log1p, "expm1": jnp.expm1, "tan": jnp.tan,
}
for _name, _fn in _UNARY_FLOAT.items():
    xla(f"aten::{_name}", f"aten::{_name}_", name=_name)(_unary_float(_fn))


@xla("aten::neg", "aten::neg_")
def neg(x):
    return -x


@xla("aten::abs", "aten::abs_")
def abs_(x):
    return jnp.abs(x)


@xla("aten::add.Tensor", "aten::add.Scalar", "aten::add_.Tensor", "aten::add_.Scalar")
def add(x, other, alpha=1):
    dt = out_dtype()
    y = as_dtype(other, dt)
    return as_dtype(x, dt) + (y if alpha == 1 else y * as_dtype(alpha, dt))


@xla("aten::sub.Tensor", "aten::sub.Scalar", "aten::sub_.Tensor", "aten::sub_.Scalar")
def sub(x, other, alpha=1):
    dt = out_dtype()
    y = as_dtype(other, dt)
    return as_dtype(x, dt) - (y if alpha == 1 else y * as_dtype(alpha, dt))


@xla("aten::mul.Tensor", "aten::mul.Scalar", "aten::mul_.Tensor", "aten::mul_.Scalar")
def mul(x, other):
    dt = out_dtype()
    return as_dtype(x, dt) * as_dtype(other, dt)


@xla("aten::div.Tensor", "aten::div.Scalar", "aten::div_.Tensor", "aten::div_.Scalar")
def div(x, other):
    dt = out_dtype()
    return as_dtype(x, dt) / as_dtype(other, dt)


_COMPARE = {"eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
            "gt": jnp.greater, "ge": jnp.greater_equal}


def _compare(fn):
    def lower(x, other):
        dt = compute_dtype(x, other)  # compare in the promoted type, as torch does
        return fn(as_dtype(x, dt), as_dtype(other, dt))
    return lower


for _name, _fn in _COMPARE.items():
    xla(f"aten::{_name}.Tensor", f"aten::{_name}.Scalar", f"aten::{_name}_.Tensor",
        f"aten::{_name}_.Scalar", name=_name)(_compare(_fn))


@xla("aten::where.self")
def where(cond, x, other):
    dt = out_dtype()
    return jnp.where(cond, as_dtype(x, dt), as_dtype(other, dt))
