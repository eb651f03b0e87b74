"""Reduction lowerings: sum/mean/prod/nansum, trace, max/min/amax/amin/aminmax and
argmax/argmin, all/any/count_nonzero, and whole-tensor comparisons (allclose, equal)."""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import scalar_type_name
from tpu_kernels.registry.xla._index import broadcast_shape
from tpu_kernels.registry.xla._reduce import acc_dtype, one_axis, reduced_axes


# -- sum / mean / prod / nansum -----------------------------------------------------------
def _accumulating(fn: Callable) -> Callable:
    """sum-like reduction: accumulate in float32 for half types (as torch's CPU kernels)."""
    def lower(self, dim=None, keepdim=False, *, dtype=None):
        dt = out_dtype()
        axes = reduced_axes(dim, self.ndim)
        return fn(self.astype(acc_dtype(dt)), axis=axes, keepdims=keepdim).astype(dt)
    return lower


xla("aten::sum.dim_IntList", "aten::sum.default", name="sum")(_accumulating(jnp.sum))
xla("aten::nansum.default", name="nansum")(_accumulating(jnp.nansum))
xla("aten::mean.dim", "aten::mean.default", name="mean")(_accumulating(jnp.mean))
xla("aten::prod.default", name="prod")(_accumulating(jnp.prod))


@xla("aten::prod.dim_int")
def prod_dim(self, dim, keepdim=False, *, dtype=None):
    dt = out_dtype()
    return jnp.prod(self.astype(acc_dtype(dt)), axis=reduced_axes(dim, self.ndim), keepdims=keepdim).astype(dt)


@xla("aten::trace.default")
def trace(self):
    dt = out_dtype()
    return jnp.trace(self.astype(acc_dtype(dt))).astype(dt)


# -- max / min family ----------------------------------------------------------------------
@xla("aten::amax.default", "aten::max.default")
def amax(self, dim=(), keepdim=False):
    return jnp.max(self, axis=reduced_axes(dim, self.ndim), keepdims=keepdim)


@xla("aten::amin.default", "aten::min.default")
def amin(self, dim=(), keepdim=False):
    return jnp.min(self, axis=reduced_axes(dim, self.ndim), keepdims=keepdim)


def _arg_select(arg: Callable) -> Callable:
    """max.dim/min.dim: the values at the first arg index (NaN counts as extreme)."""
    def lower(self, dim, keepdim=False):
        ax = one_axis(dim, self.ndim)
        if ax is None:
            return self, jnp.zeros((), jnp.int64)
        idx = arg(self, axis=ax, keepdims=True)
        vals = jnp.take_along_axis(self, idx, axis=ax)
        if not keepdim:
            idx, vals = jnp.squeeze(idx, ax), jnp.squeeze(vals, ax)
        return vals, idx.astype(jnp.int64)
    return lower


xla("aten::max.dim", name="max_dim")(_arg_select(jnp.argmax))
xla("aten::min.dim", name="min_dim")(_arg_select(jnp.argmin))


def _arg(fn: Callable) -> Callable:
    """argmax/argmin: first index of the extreme; dim None means the flattened tensor."""
    def lower(self, dim=None, keepdim=False):
        if dim is None:
            idx = fn(self.reshape(-1))
            return idx.reshape((1,) * self.ndim) if keepdim else idx
        ax = one_axis(dim, self.ndim)
        return jnp.zeros((), jnp.int64) if ax is None else fn(self, axis=ax, keepdims=keepdim)
    return lower


xla("aten::argmax.default", name="argmax")(_arg(jnp.argmax))
xla("aten::argmin.default", name="argmin")(_arg(jnp.argmin))


@xla("aten::aminmax.default")
def aminmax(self, *, dim=None, keepdim=False):
    axes = reduced_axes(dim, self.ndim)
    if dim is None and keepdim:   # torch keeps every dim as size 1
        return (jnp.min(self, axis=axes, keepdims=True), jnp.max(self, axis=axes, keepdims=True))
    return jnp.min(self, axis=axes, keepdims=keepdim), jnp.max(self, axis=axes, keepdims=keepdim)


# -- boolean reductions ---------------------------------------------------------------------
def _logical(fn: Callable) -> Callable:
    def lower(self, dim=None, keepdim=False):
        if isinstance(dim, (list, tuple)) and len(dim) == 0:
            # all.dims/any.dims with dim=[] reduce nothing (unlike sum's [] = all dims)
            return self != 0
        return fn(self != 0, axis=reduced_axes(dim, self.ndim), keepdims=keepdim)
    return lower


xla("aten::all.default", "aten::all.dim", "aten::all.dims", "aten::_is_all_true.default",
    name="all")(_logical(jnp.all))
xla("aten::any.default", "aten::any.dim", "aten::any.dims", "aten::_is_any_true.default",
    name="any")(_logical(jnp.any))


@xla("aten::count_nonzero.default", "aten::count_nonzero.dim_IntList")
def count_nonzero(self, dim=None):
    return jnp.sum(self != 0, axis=reduced_axes(dim, self.ndim), dtype=jnp.int64)


# -- whole-tensor comparisons (Python bool results) ----------------------------------------------
@xla("aten::allclose.default", data_dependent=True)
def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    _check_isclose(self, other, rtol, atol)
    return bool(jnp.allclose(self, other, rtol=rtol, atol=atol, equal_nan=equal_nan))


def _check_isclose(self, other, rtol, atol) -> None:
    """torch's isclose checks (jnp.allclose would promote an int tensor against a float one)."""
    if self.dtype != other.dtype:
        raise RuntimeError(f"{scalar_type_name(self.dtype)} did not match {scalar_type_name(other.dtype)}")
    broadcast_shape(self.shape, other.shape)   # torch's message where they do not broadcast
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if tol < 0:
            raise RuntimeError(f"{name} must be greater than or equal to zero, but got {tol:g}")


@xla("aten::equal.default", data_dependent=True)
def equal(self, other):
    return self.shape == other.shape and bool(jnp.all(self == other))
