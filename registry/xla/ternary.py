"""Pointwise lowerings of a tensor and two more operands: where, clamp (and clamp_min /
clamp_max, one bound), lerp, addcmul, addcdiv (prims::fma: registry/inductor_prims.py).

The ``*_core`` functions take the result dtype explicitly, so the ``_foreach_*`` lowerings
reuse them per list element.
"""
from __future__ import annotations

import jax.numpy as jnp

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import kernel_error
from tpu_kernels.registry.xla._util import as_dtype, float_compute


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


@xla("aten::lerp.Scalar")
def lerp(x, end, weight):
    return lerp_core(x, end, weight, _lerp_dtype("lerp_kernel_scalar"))


@xla("aten::lerp.Tensor")
def lerp_tensor(x, end, weight):
    return lerp_core(x, end, weight, _lerp_dtype("lerp_kernel_tensor"))


def _lerp_dtype(kernel: str):
    """The result dtype; torch's lerp kernels exist for floating and complex types only
    (an integer lerp truncated its weight here)."""
    dt = out_dtype()
    if not jnp.issubdtype(dt, jnp.inexact):
        raise kernel_error(kernel, dt)
    return dt


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
