"""Variance and standard deviation lowerings: var, std, var_mean, std_mean (every
overload: correction, unbiased, dims)."""
from __future__ import annotations


import jax.numpy as jnp

from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._reduce import acc_dtype, count_of, reduced_axes


def _moments(self, dim, correction, keepdim):
    """(var, mean) over ``dim`` with ``correction`` (default 1), computed in float32+."""
    if not jnp.issubdtype(self.dtype, jnp.inexact):  # torch's meta functions let ints through
        raise RuntimeError("std and var only support floating point and complex dtypes")
    x = self.astype(acc_dtype(self.dtype))  # the dispatcher casts var to torch's (real) dtype
    axes = reduced_axes(dim, self.ndim)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    d = x - mean
    sq = (d.real ** 2 + d.imag ** 2) if jnp.iscomplexobj(d) else d * d
    n = count_of(self.shape, axes)
    corr = 1 if correction is None else correction
    var = jnp.sum(sq, axis=axes, keepdims=keepdim) / jnp.maximum(n - corr, 0)
    return var, (mean if keepdim else jnp.squeeze(mean, axes))


def _unbiased(unbiased: bool) -> int:
    return 1 if unbiased else 0


@xla("aten::var.correction")
def var(self, dim=None, *, correction=None, keepdim=False):
    return _moments(self, dim, correction, keepdim)[0]


@xla("aten::var.dim")
def var_dim(self, dim, unbiased=True, keepdim=False):
    return _moments(self, dim, _unbiased(unbiased), keepdim)[0]


@xla("aten::var.default")
def var_default(self, unbiased=True):
    return _moments(self, None, _unbiased(unbiased), False)[0]


@xla("aten::std.correction")
def std(self, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_moments(self, dim, correction, keepdim)[0])


@xla("aten::std.dim")
def std_dim(self, dim, unbiased=True, keepdim=False):
    return jnp.sqrt(_moments(self, dim, _unbiased(unbiased), keepdim)[0])


@xla("aten::std.default")
def std_default(self, unbiased=True):
    return jnp.sqrt(_moments(self, None, _unbiased(unbiased), False)[0])


@xla("aten::var_mean.correction")
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    return _moments(self, dim, correction, keepdim)


@xla("aten::std_mean.correction")
def std_mean(self, dim=None, *, correction=None, keepdim=False):
    v, m = _moments(self, dim, correction, keepdim)
    return jnp.sqrt(v), m
