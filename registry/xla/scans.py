"""Cumulative scan lowerings: cumsum, cumprod, logcumsumexp, cummax, cummin."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._reduce import acc_dtype, one_axis


def _scan(fn: Callable) -> Callable:
    def lower(self, dim, *, dtype=None):
        dt = out_dtype()
        x = self.astype(acc_dtype(dt))
        ax = one_axis(dim, self.ndim)
        return (x if ax is None else fn(x, axis=ax)).astype(dt)
    return lower


xla("aten::cumsum.default", name="cumsum")(_scan(jnp.cumsum))
xla("aten::cumprod.default", name="cumprod")(_scan(jnp.cumprod))


@xla("aten::logcumsumexp.default")
def logcumsumexp(self, dim):
    dt = out_dtype()
    x = self.astype(acc_dtype(dt))
    ax = one_axis(dim, self.ndim)
    if ax is None or x.shape[ax] == 0:
        return x.astype(dt)
    return jax.lax.cumlogsumexp(x, axis=ax).astype(dt)


def _cum_extreme(greater: bool) -> Callable:
    """cummax/cummin: running extreme and its index (latest index among ties; NaN sticks)."""
    def combine(a, b):
        (va, ia), (vb, ib) = a, b
        better = vb >= va if greater else vb <= va
        if jnp.issubdtype(va.dtype, jnp.inexact):
            better = jnp.isnan(vb) | (~jnp.isnan(va) & better)
        return jnp.where(better, vb, va), jnp.where(better, ib, ia)

    def lower(self, dim):
        ax = one_axis(dim, self.ndim)
        if ax is None:
            return self, jnp.zeros((), jnp.int64)
        if self.shape[ax] == 0:
            return self, jnp.zeros(self.shape, jnp.int64)
        shape = [1] * self.ndim
        shape[ax] = self.shape[ax]
        iota = jnp.broadcast_to(jnp.arange(self.shape[ax], dtype=jnp.int64).reshape(shape), self.shape)
        return jax.lax.associative_scan(combine, (self, iota), axis=ax)
    return lower


xla("aten::cummax.default", name="cummax")(_cum_extreme(True))
xla("aten::cummin.default", name="cummin")(_cum_extreme(False))
