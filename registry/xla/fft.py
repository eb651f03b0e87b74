"""FFT lowerings: torch's three primitive transforms (_fft_c2c, _fft_r2c, _fft_c2r).

torch.fft.* reach these with the normalization already resolved to an int: 0 = none,
1 = 1/sqrt(n), 2 = 1/n, where n is the number of signal elements transformed (the
output sizes for c2r). The jax transforms run unscaled and the scale is applied here.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from tpu_kernels.registry.decorator import xla


def _scaled(x: jax.Array, n: int, normalization: int) -> jax.Array:
    if normalization == 0 or n == 0:
        return x
    scale = 1 / math.sqrt(n) if normalization == 1 else 1 / n
    return x * jnp.asarray(scale, jnp.finfo(x.dtype).dtype)


def _signal_size(shape: tuple[int, ...], dim) -> int:
    return math.prod(shape[d] for d in dim)


@xla("aten::_fft_c2c.default")
def fft_c2c(self, dim, normalization, forward):
    dim = tuple(dim)
    if not dim:
        return self
    # norm="backward" leaves fftn unscaled; norm="forward" leaves ifftn unscaled
    out = jnp.fft.fftn(self, axes=dim, norm="backward") if forward else \
        jnp.fft.ifftn(self, axes=dim, norm="forward")
    return _scaled(out, _signal_size(self.shape, dim), normalization)


@xla("aten::_fft_r2c.default")
def fft_r2c(self, dim, normalization, onesided):
    dim = tuple(dim)
    out = jnp.fft.rfftn(self, axes=dim) if onesided else jnp.fft.fftn(self, axes=dim)
    return _scaled(out, _signal_size(self.shape, dim), normalization)


@xla("aten::_fft_c2r.default")
def fft_c2r(self, dim, normalization, last_dim_size):
    dim = tuple(dim)
    sizes = [self.shape[d] for d in dim[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(self, s=sizes, axes=dim, norm="forward")
    return _scaled(out, math.prod(sizes), normalization)
