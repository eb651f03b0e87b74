"""Matmul-family and linear-algebra lowerings.

Matmuls go through ``jax.lax.dot_general``: half types accumulate in float32, integers
in int64 (exact; torch wraps to the result dtype the same way), float32 at the precision
``torch.get_float32_matmul_precision()`` selects (the dispatch cache is keyed on it).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import float_compute

_PRECISION = {"highest": jax.lax.Precision.HIGHEST, "high": jax.lax.Precision.HIGH,
              "medium": jax.lax.Precision.DEFAULT}


def _acc_dtype(dtype):
    """The dtype a matmul accumulates in for operands of ``dtype``."""
    if jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
        return jnp.dtype(jnp.int64)
    return float_compute(dtype)


def _precision(dtype):
    if dtype == jnp.float32 or dtype == jnp.complex64:
        return _PRECISION.get(torch.get_float32_matmul_precision(), jax.lax.Precision.HIGHEST)
    return jax.lax.Precision.HIGHEST


def _dot(a: jax.Array, b: jax.Array, contract: tuple, batch: tuple = ((), ())) -> jax.Array:
    """dot_general in torch's result dtype, accumulated in ``_acc_dtype`` (result not cast)."""
    dt = jnp.promote_types(a.dtype, b.dtype)
    acc = _acc_dtype(dt)
    if acc == jnp.int64:  # XLA integer dots are exact; int64 keeps products from overflowing
        a, b = a.astype(acc), b.astype(acc)
    else:
        a, b = a.astype(dt), b.astype(dt)
    return jax.lax.dot_general(a, b, (contract, batch), precision=_precision(dt),
                               preferred_element_type=acc)


def _matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b for (..., n, k) x (..., k, m) / (n, k) x (k,) / (k,) x (k,)."""
    if a.ndim == 3:
        return _dot(a, b, ((2,), (1,)), ((0,), (0,)))
    return _dot(a, b, ((a.ndim - 1,), (0,)))


def _scaled_add(self, prod, beta, alpha):
    """beta * self + alpha * prod in the accumulation dtype; beta == 0 ignores self (NaNs too)."""
    dt = out_dtype()
    if dt == jnp.bool_:
        return (jnp.asarray(beta, bool) & (self != 0)) | (jnp.asarray(alpha, bool) & (prod != 0))
    acc = prod.dtype
    p = prod * jnp.asarray(alpha, acc)
    s = self.astype(acc)
    bias = jnp.where(jnp.asarray(beta) == 0, jnp.zeros((), acc), s * jnp.asarray(beta, acc))
    return (bias + p).astype(dt)


@xla("aten::mm.default", "aten::bmm.default", "aten::mv.default", "aten::dot.default")
def mm(self, mat2):
    return _matmul(self, mat2)


@xla("aten::vdot.default")
def vdot(self, other):
    return _dot(jnp.conj(self), other, ((0,), (0,)))


@xla("aten::addmm.default", "aten::baddbmm.default", "aten::addmv.default")
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _scaled_add(self, _matmul(mat1, mat2), beta, alpha)


@xla("aten::addbmm.default")
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    # contract the batch dim together with k: sum_b batch1[b] @ batch2[b]
    prod = _dot(batch1, batch2, ((0, 2), (0, 1)))
    return _scaled_add(self, prod, beta, alpha)


@xla("aten::addr.default")
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    return _scaled_add(self, _dot(vec1[:, None], vec2[None, :], ((1,), (0,))), beta, alpha)


@xla("aten::_trilinear.default")
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    a = jnp.expand_dims(i1, tuple(expand1)) if expand1 else i1
    b = jnp.expand_dims(i2, tuple(expand2)) if expand2 else i2
    c = jnp.expand_dims(i3, tuple(expand3)) if expand3 else i3
    acc = float_compute(out_dtype())
    prod = a.astype(acc) * b.astype(acc) * c.astype(acc)
    return jnp.sum(prod, axis=tuple(sumdim)) if sumdim else prod
