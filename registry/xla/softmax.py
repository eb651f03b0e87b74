"""Softmax family: _softmax, _log_softmax, _safe_softmax and their backward ops.

Half types compute in float32 (as torch's CPU kernels do); the result takes torch's dtype.
A 0-d input is treated as one row of one element.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import float_compute


def _rowwise(fn: Callable[[jax.Array, int], jax.Array]) -> Callable[..., jax.Array]:
    """Lift ``fn(x, axis)`` to 0-d inputs and compute in float32 for half types."""
    def lower(x: jax.Array, dim: int, *rest) -> jax.Array:
        n = max(x.ndim, 1)  # torch's _softmax meta function does not check dim: check here
        if not -n <= dim < n:
            raise IndexError(f"softmax: Dimension out of range (expected to be in range of "
                             f"[{-n}, {n - 1}], but got {dim})")
        if not jnp.issubdtype(x.dtype, jnp.inexact):  # torch's kernels: floating types only
            from tpu_kernels.registry.dtypes import to_torch_dtype
            raise NotImplementedError(f"softmax: not implemented for {to_torch_dtype(x.dtype)}")
        dt = out_dtype()
        xc = x.astype(float_compute(dt))
        if xc.ndim == 0:
            return fn(xc[None], 0)[0].astype(dt)
        return fn(xc, dim % xc.ndim).astype(dt)
    return lower


def softmax_along(x: jax.Array, axis: int) -> jax.Array:
    """exp(x - max) / sum(exp(x - max)): a row of all -inf gives NaN, as in torch."""
    m = jnp.max(x, axis=axis, keepdims=True, initial=-jnp.inf)
    e = jnp.exp(x - jax.lax.stop_gradient(m))
    return e / jnp.sum(e, axis=axis, keepdims=True)


def log_softmax_along(x: jax.Array, axis: int) -> jax.Array:
    shifted = x - jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True, initial=-jnp.inf))
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True))


def _safe_softmax_along(x: jax.Array, axis: int) -> jax.Array:
    """Softmax, but rows that are entirely -inf give zeros instead of NaN."""
    dead = jnp.all(x == -jnp.inf, axis=axis, keepdims=True)
    return jnp.where(dead, 0.0, softmax_along(x, axis))


xla("aten::_softmax", name="_softmax")(_rowwise(softmax_along))
xla("aten::_log_softmax", name="_log_softmax")(_rowwise(log_softmax_along))


@xla("aten::_safe_softmax")
def _safe_softmax(x, dim, dtype=None):
    return _rowwise(_safe_softmax_along)(x, dim)


def _backward(fn: Callable[[jax.Array, jax.Array, int], jax.Array]) -> Callable[..., jax.Array]:
    def lower(grad_output, output, dim, input_dtype):
        dt = out_dtype()
        ct = float_compute(jnp.result_type(grad_output.dtype, output.dtype))
        g, y = grad_output.astype(ct), output.astype(ct)
        if g.ndim == 0:
            return fn(g[None], y[None], 0)[0].astype(dt)
        return fn(g, y, dim % g.ndim).astype(dt)
    return lower


def _softmax_grad(g, y, axis):
    gy = g * y
    return gy - y * jnp.sum(gy, axis=axis, keepdims=True)


def _log_softmax_grad(g, y, axis):
    return g - jnp.exp(y) * jnp.sum(g, axis=axis, keepdims=True)


xla("aten::_softmax_backward_data", name="_softmax_backward_data")(_backward(_softmax_grad))
xla("aten::_log_softmax_backward_data", name="_log_softmax_backward_data")(_backward(_log_softmax_grad))
