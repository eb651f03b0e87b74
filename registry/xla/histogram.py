"""Histogram lowerings: histc, histogram, histogramdd and bincount.

Bins are half-open except the last, which is closed; values outside the edges (and NaN)
are not counted. Edges computed from the data follow torch: the data's (per-dimension)
min and max, or ``range``, widened by 0.5 each way when empty, split by linspace in the
input's dtype. torch has no meta functions for the histogram ops: they run eagerly.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from tpu_kernels.registry.context import check
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import kernel_error


@xla("aten::histc.default")
def histc(self, bins=100, min=0, max=0):
    x = self.reshape(-1)
    lo, hi = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    auto = lo == hi  # min == max: use the data's range (widened by 1 if still empty)
    if x.size:
        lo = jnp.where(auto, jnp.min(x), lo)
        hi = jnp.where(auto, jnp.max(x), hi)
    lo, hi = jnp.where(lo == hi, lo - 1, lo), jnp.where(lo == hi, hi + 1, hi)
    inside = (x >= lo) & (x <= hi)
    pos = jnp.floor((x - lo) * bins / (hi - lo)).astype(jnp.int64)
    pos = jnp.clip(pos, 0, bins - 1)  # x == max falls in the last bin
    return jnp.zeros((bins,), x.dtype).at[pos].add(inside.astype(x.dtype))


def _histogram(x, edges, weight, density):
    """Counts of ``x`` in the bins ``edges`` (the last bin closed), optionally a density."""
    x = x.reshape(-1)
    nb = edges.shape[0] - 1
    pos, inside = _bin_of(x, edges)
    w = jnp.ones_like(x) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros((nb,), x.dtype).at[pos].add(jnp.where(inside, w, 0))
    if density:
        hist = hist / (jnp.sum(hist) * jnp.diff(edges))
    return hist, edges


def _edges(x, bins: int, lo_hi) -> jax.Array:
    """``bins + 1`` edges over ``lo_hi`` (or the data's range) in ``x``'s dtype."""
    if lo_hi is not None:
        lo, hi = float(lo_hi[0]), float(lo_hi[1])
    elif x.size:
        lo, hi = float(jnp.min(x)), float(jnp.max(x))
    else:
        lo, hi = 0.0, 1.0  # no data: numpy's default range
    if lo == hi:  # an empty range widens by 0.5 each way (numpy's rule)
        lo, hi = lo - 0.5, hi + 0.5
    return jnp.linspace(lo, hi, bins + 1, dtype=jnp.float64).astype(x.dtype)


def _bin_of(x, edges):
    """(bin index, inside the edges) of each value of ``x``."""
    nb = edges.shape[0] - 1
    pos = jnp.clip(jnp.searchsorted(edges, x, side="right") - 1, 0, nb - 1)
    return pos, (x >= edges[0]) & (x <= edges[-1])


@xla("aten::histogram.bin_ct", data_dependent=True)
def histogram(self, bins=100, *, range=None, weight=None, density=False):
    return _histogram(self, _edges(self.reshape(-1), bins, range), weight, density)


@xla("aten::histogram.bins_tensor", data_dependent=True)
def histogram_bins(self, bins, *, weight=None, density=False):
    return _histogram(self, bins.astype(self.dtype), weight, density)


_BINCOUNT_INPUTS = "bincount only supports 1-d non-negative integral inputs."


def _check_bincount(self, weights, minlength: int) -> None:
    """CPU's argument checks, in its order (the empty input returns before the others)."""
    if not jnp.issubdtype(self.dtype, jnp.integer):   # (bool included: CPU has no kernel)
        raise kernel_error("bincount_cpu", self.dtype)
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if self.ndim == 1 and self.size == 0:
        return
    if self.ndim != 1:
        raise RuntimeError(_BINCOUNT_INPUTS)
    # negative values: XLA would wrap them; raised at the next sync (values are on the device)
    check(self >= 0, _BINCOUNT_INPUTS, RuntimeError)
    if weights is not None and (weights.ndim != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")


@xla("aten::bincount.default", data_dependent=True)
def bincount(self, weights=None, minlength=0):
    _check_bincount(self, weights, minlength)
    if self.size == 0:
        return jnp.zeros((minlength,), jnp.int64)  # int64 even with weights, as on CPU
    n = max(int(jnp.max(self)) + 1, minlength)
    if weights is None:
        return jnp.zeros((n,), jnp.int64).at[self].add(1)
    dt = weights.dtype if weights.dtype == jnp.float32 else jnp.float64  # torch's rule
    return jnp.zeros((n,), dt).at[self].add(weights.astype(dt))




# -- histogramdd: the last dimension of the input holds the D coordinates --------------------------
def _points(x):
    return x.reshape(-1, x.shape[-1])


def _dd_edges(x, bins, range):
    pts = _points(x)
    return [_edges(pts[:, d], int(b), None if range is None else range[2 * d: 2 * d + 2])
            for d, b in enumerate(bins)]


def _histogramdd(x, edges, weight, density):
    pts = _points(x)
    dims = tuple(int(e.shape[0]) - 1 for e in edges)
    flat = jnp.zeros((pts.shape[0],), jnp.int64)
    inside = jnp.ones((pts.shape[0],), bool)
    for d, e in enumerate(edges):
        pos, ok = _bin_of(pts[:, d], e.astype(pts.dtype))
        flat = flat * dims[d] + pos
        inside &= ok
    w = jnp.ones((pts.shape[0],), x.dtype) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros((math.prod(dims),), x.dtype).at[flat].add(jnp.where(inside, w, 0)).reshape(dims)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            shape = [1] * len(dims)
            shape[d] = dims[d]
            hist = hist / jnp.diff(e.astype(x.dtype)).reshape(shape)
    return hist


@xla("aten::_histogramdd_bin_edges", data_dependent=True)
def histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    return _dd_edges(self, bins, range)


@xla("aten::_histogramdd_from_bin_cts", data_dependent=True)
def histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    return _histogramdd(self, _dd_edges(self, bins, range), weight, density)


@xla("aten::_histogramdd_from_bin_tensors", data_dependent=True)
def histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    return _histogramdd(self, list(bins), weight, density)
