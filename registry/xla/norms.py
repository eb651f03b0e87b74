"""logsumexp and norm lowerings: linalg_vector_norm, norm, dist, renorm."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.registry.xla._reduce import acc_dtype, one_axis, reduced_axes


@xla("aten::logsumexp.default")
def logsumexp(self, dim, keepdim=False):
    dt = out_dtype()
    x = self.astype(acc_dtype(dt))
    axes = reduced_axes(dim, self.ndim)
    if not axes:
        return x
    m = jnp.max(x, axis=axes, keepdims=True, initial=-jnp.inf)  # empty rows give -inf
    m = jnp.where(jnp.isfinite(m), jax.lax.stop_gradient(m), 0)  # all -inf rows give -inf
    s = jnp.log(jnp.sum(jnp.exp(x - m), axis=axes, keepdims=True)) + m
    return (s if keepdim else jnp.squeeze(s, axes)).astype(dt)


def _vector_norm(x: jax.Array, ord: Any, axes: tuple[int, ...], keepdim: bool) -> jax.Array:
    """The ``ord``-norm of ``x`` (already in its compute dtype) over ``axes``."""
    a = jnp.abs(x)
    if ord == float("inf"):
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@xla("aten::linalg_vector_norm.default", static=("ord",))
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = self.astype(acc_dtype(self.dtype if dtype is None else to_jax_dtype(dtype)))
    return _vector_norm(x, float(ord), reduced_axes(dim, self.ndim), keepdim)


@xla("aten::norm.ScalarOpt_dim", "aten::norm.Scalar", "aten::norm.ScalarOpt_dtype",
     "aten::norm.ScalarOpt_dim_dtype", static=("p",))
def norm(self, p=2, dim=None, keepdim=False, *, dtype=None):
    x = self.astype(acc_dtype(self.dtype if dtype is None else to_jax_dtype(dtype)))
    return _vector_norm(x, 2.0 if p is None else float(p), reduced_axes(dim, self.ndim), keepdim)


@xla("aten::dist.default", static=("p",))
def dist(self, other, p=2):
    dt = out_dtype()
    d = self.astype(acc_dtype(dt)) - other.astype(acc_dtype(dt))
    return _vector_norm(d, float(p), tuple(range(d.ndim)), False).astype(dt)


@xla("aten::renorm.default", static=("p",))
def renorm(self, p, dim, maxnorm):
    """Rescale each slice along ``dim`` whose p-norm exceeds ``maxnorm`` down to it."""
    dt = out_dtype()
    x = self.astype(acc_dtype(dt))
    ax = one_axis(dim, self.ndim)
    others = tuple(a for a in range(self.ndim) if a != ax)
    n = _vector_norm(x, float(p), others, True)
    scale = jnp.where(n > maxnorm, maxnorm / (n + 1e-7), 1.0)  # torch's epsilon
    return (x * scale.astype(x.dtype)).astype(dt)
