"""Pooling lowerings: max (with torch's flat indices), average, adaptive, fractional, unpool.

Spatial dims are the trailing ``nd`` dims; leading dims (batch, channels) are optional
as in torch. Max pools gather each window (indices are static numpy tables, or per plane
for fractional pooling), so values and the flat index ``h * W + w`` within each input
plane come from one pass; backwards scatter the gradient through those indices.
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tpu_kernels.registry.context import check, out_dtype, out_shape
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import meta_like
from tpu_kernels.registry.xla._util import float_compute


def _tup(v: int | Sequence[int], nd: int, default: Sequence[int] | None = None) -> tuple[int, ...]:
    """An int-list argument expanded to ``nd`` entries (empty: ``default``)."""
    v = (v,) if isinstance(v, int) else tuple(v)
    if not v:
        return tuple(default)
    return v * nd if len(v) == 1 else v


# -- window tables ------------------------------------------------------------------------------
def _adaptive_windows(n: int, out: int):
    """torch's adaptive windows: [floor(i*n/out), ceil((i+1)*n/out))."""
    start = (np.arange(out) * n) // out
    end = -((-(np.arange(out) + 1) * n) // out)
    k = int((end - start).max()) if out else 0
    idx = start[:, None] + np.arange(k)[None, :]
    return idx, idx < end[:, None]


def _flat_table(tables, sizes):
    """Per-dim (out_d, k_d) tables -> flat plane index and validity of shape (*out, prod k)."""
    nd = len(tables)
    flat, valid = 0, True
    plane_stride = np.cumprod((1,) + tuple(sizes[::-1]))[::-1][1:]
    for d, (idx, ok) in enumerate(tables):
        shape = [1] * (2 * nd)
        shape[d], shape[nd + d] = idx.shape
        flat = flat + np.clip(idx, 0, None).reshape(shape) * plane_stride[d]
        valid = valid & ok.reshape(shape)
    outs = tuple(t[0].shape[0] for t in tables)
    flat = np.broadcast_to(flat, outs + tuple(t[0].shape[1] for t in tables))
    valid = np.broadcast_to(valid, flat.shape)
    return flat.reshape(outs + (-1,)), valid.reshape(outs + (-1,))


# -- max pooling ---------------------------------------------------------------------------------
def _rows(a: jax.Array, lead: int) -> jax.Array:
    """``a`` with its dims after the first ``lead`` flattened into one (``reshape(..., -1)``,
    which cannot infer the size when a leading dim is 0: an empty batch)."""
    return a.reshape(a.shape[:lead] + (math.prod(a.shape[lead:]),))


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _window_max(x: jax.Array, nd: int, flat, valid) -> tuple[jax.Array, jax.Array]:
    """Max over windows given by flat plane indices ``flat`` (*out, K) (or per plane:
    (*lead, *out, K)); returns values and the int64 flat index of the first maximum
    (NaN counts as the maximum, as in torch)."""
    lead = x.shape[:-nd]
    planes = _rows(x, len(lead))
    outs = flat.shape[-1 - nd:-1]
    if isinstance(flat, np.ndarray):
        vals = planes[..., flat.reshape(-1)].reshape(lead + flat.shape)
    else:
        vals = jnp.take_along_axis(planes, _rows(flat, len(lead)), axis=-1).reshape(flat.shape)
    vals = jnp.where(valid, vals, _lowest(x.dtype))
    m = vals.max(-1, keepdims=True)  # NaN propagates
    hit = valid & ((vals == m) | (jnp.isnan(vals) & jnp.isnan(m)))
    k = jnp.argmax(hit, axis=-1)[..., None]
    flat_b = jnp.broadcast_to(jnp.asarray(flat, jnp.int64), lead + tuple(outs) + (flat.shape[-1],))
    idx = jnp.take_along_axis(flat_b, k, axis=-1)[..., 0]
    return m[..., 0], idx


class _Geometry:
    """A strided pool's window geometry over the trailing ``nd`` dims."""

    def __init__(self, sizes, outs, kernel_size, stride, padding, dilation):
        nd = len(sizes)
        self.sizes, self.outs = tuple(sizes), tuple(outs)
        self.k = _tup(kernel_size, nd)
        self.s, self.p, self.d = _tup(stride, nd, self.k), _tup(padding, nd), _tup(dilation, nd)
        # the padded extent every window offset fits in (ceil_mode windows may overhang)
        self.extent = tuple(max(pp + n, (kk - 1) * dd + (o - 1) * ss + 1)
                            for n, o, kk, ss, pp, dd in zip(sizes, outs, self.k, self.s, self.p, self.d))
        self.offsets = list(itertools.product(*(range(kk) for kk in self.k)))

    def window_slice(self, off):
        """Strided slice (of the padded input) holding kernel offset ``off`` of every window."""
        return tuple(slice(o * d, o * d + (n - 1) * s + 1, s)
                     for o, d, n, s in zip(off, self.d, self.outs, self.s))

    def positions(self, off):
        """Per dim, the input position of offset ``off`` of each window (numpy, (out_d,))."""
        return [np.arange(n) * s - p + o * d for n, s, p, o, d in zip(self.outs, self.s, self.p, off, self.d)]

    def flat_and_valid(self, off):
        """Flat plane index and in-bounds mask of offset ``off`` for every window (*outs)."""
        nd = len(self.sizes)
        flat, valid = np.zeros(self.outs, np.int64), np.ones(self.outs, bool)
        for dim, (pos, n) in enumerate(zip(self.positions(off), self.sizes)):
            shape = [1] * nd
            shape[dim] = -1
            flat = flat * n + np.clip(pos, 0, n - 1).reshape(shape)
            valid = valid & ((pos >= 0) & (pos < n)).reshape(shape)
        return flat, valid


def _max_pool(self, nd, kernel_size, stride, padding, dilation):
    """Values and flat indices from one strided slice per kernel offset (no gathers)."""
    geo = _Geometry(self.shape[-nd:], out_shape(0)[-nd:], kernel_size, stride, padding, dilation)
    lead = self.ndim - nd
    pads = [(0, 0)] * lead + [(p, e - p - n) for p, e, n in zip(geo.p, geo.extent, geo.sizes)]
    xp = jnp.pad(self, pads, constant_values=_lowest(self.dtype))
    vals = jnp.stack([xp[(...,) + geo.window_slice(off)] for off in geo.offsets], axis=-1)
    tables = [geo.flat_and_valid(off) for off in geo.offsets]
    flat = np.stack([t[0] for t in tables], -1)
    valid = np.stack([t[1] for t in tables], -1)
    m = vals.max(-1, keepdims=True)  # NaN propagates
    hit = valid & ((vals == m) | (jnp.isnan(vals) & jnp.isnan(m)))
    k = jnp.argmax(hit, axis=-1)  # the first maximum, as torch
    idx = jnp.zeros(k.shape, jnp.int64)
    for j in range(flat.shape[-1]):  # select the index of offset k, without a gather
        idx = jnp.where(k == j, jnp.asarray(flat[..., j]), idx)
    return m[..., 0], idx


@xla("aten::max_pool2d_with_indices")
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, 2, kernel_size, stride, padding, dilation)


@xla("aten::max_pool3d_with_indices")
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, 3, kernel_size, stride, padding, dilation)


def _max_pool_backward(grad_output, self, indices, nd, kernel_size, stride, padding, dilation):
    """Route each gradient to the offset its index names: one dilating pad per kernel offset
    (the transpose of the forward's strided slices), no scatter."""
    geo = _Geometry(self.shape[-nd:], grad_output.shape[-nd:], kernel_size, stride, padding, dilation)
    acc = float_compute(grad_output.dtype)
    g = grad_output.astype(acc)
    lead = self.ndim - nd
    total = jnp.zeros(self.shape[:lead] + geo.extent, acc)
    for off in geo.offsets:
        flat, valid = geo.flat_and_valid(off)
        part = jnp.where((indices == jnp.asarray(flat)) & jnp.asarray(valid), g, 0)
        cfg = [(0, 0, 0)] * lead + [(o * d, e - (o * d + (n - 1) * s + 1), s - 1)
                                    for o, d, e, n, s in zip(off, geo.d, geo.extent, geo.outs, geo.s)]
        total = total + jax.lax.pad(part, np.zeros((), acc), cfg)
    crop = tuple(slice(p, p + n) for p, n in zip(geo.p, geo.sizes))
    return total[(...,) + crop].astype(out_dtype())


def _scatter_to_planes(grad_output, self, indices, nd: int):
    """Add each output gradient into its input position (the flat plane index)."""
    acc = float_compute(grad_output.dtype)
    b = math.prod(self.shape[:-nd])
    # (b, outputs per plane), sizes explicit: -1 cannot be inferred beside b = 0
    g = grad_output.astype(acc).reshape(b, math.prod(grad_output.shape[-nd:]))
    idx = indices.reshape(g.shape)
    out = jnp.zeros((b, math.prod(self.shape[-nd:])), acc)
    out = out.at[jnp.arange(b)[:, None], idx].add(g, mode="drop")
    return out.reshape(self.shape).astype(out_dtype())


@xla("aten::max_pool2d_with_indices_backward")
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    return _max_pool_backward(grad_output, self, indices, 2, kernel_size, stride, padding, dilation)


@xla("aten::max_pool3d_with_indices_backward")
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    return _max_pool_backward(grad_output, self, indices, 3, kernel_size, stride, padding, dilation)


def _adaptive_max(nd):
    def lower(self, output_size):
        sizes = self.shape[-nd:]
        tables = [_adaptive_windows(n, o) for n, o in zip(sizes, output_size)]
        return _window_max(self, nd, *_flat_table(tables, sizes))
    return lower


def _adaptive_max_backward(nd):
    def lower(grad_output, self, indices):
        return _scatter_to_planes(grad_output, self, indices, nd)
    return lower


for _nd in (2, 3):
    xla(f"aten::adaptive_max_pool{_nd}d", name=f"adaptive_max_pool{_nd}d")(_adaptive_max(_nd))
    xla(f"aten::adaptive_max_pool{_nd}d_backward",
        name=f"adaptive_max_pool{_nd}d_backward")(_adaptive_max_backward(_nd))


# -- fractional max pooling -----------------------------------------------------------------------
def _fractional_starts(sample, n: int, out: int, k: int):
    """torch's pseudo-random window starts for one dim; ``sample`` (*lead,) in [0, 1)."""
    if out == 1:
        return jnp.full(sample.shape + (1,), n - k, jnp.int64)
    alpha = jnp.asarray((n - k) / (out - 1), sample.dtype)
    i = jnp.arange(out - 1, dtype=sample.dtype)
    starts = (((i + sample[..., None]) * alpha).astype(jnp.int64)
              - (sample[..., None] * alpha).astype(jnp.int64))
    last = jnp.full(sample.shape + (1,), n - k, jnp.int64)
    return jnp.concatenate([starts, last], axis=-1)


def _fractional(nd):
    def lower(self, kernel_size, output_size, random_samples):
        sizes = self.shape[-nd:]
        lead = self.shape[:-nd]
        samples = random_samples.reshape(lead + (nd,))
        flat = 0
        # torch's sample order: (W, H) for 2-d pooling but (T, H, W) for 3-d
        order = (1, 0) if nd == 2 else (0, 1, 2)
        for j, d in enumerate(order):
            stride = math.prod(sizes[d + 1:])
            starts = _fractional_starts(samples[..., j], sizes[d], output_size[d], kernel_size[d])
            idx = starts[..., :, None] + jnp.arange(kernel_size[d])       # (*lead, out_d, k_d)
            shape = list(lead) + [1] * (2 * nd)
            shape[len(lead) + d], shape[len(lead) + nd + d] = output_size[d], kernel_size[d]
            flat = flat + idx.reshape(shape) * stride
        flat = jnp.broadcast_to(flat, lead + tuple(output_size) + tuple(kernel_size))
        flat = flat.reshape(lead + tuple(output_size) + (math.prod(kernel_size),))
        return _window_max(self, nd, flat, jnp.ones((), bool))
    return lower


def _fractional_backward(nd):
    def lower(grad_output, self, kernel_size, output_size, indices):
        return _scatter_to_planes(grad_output, self, indices, nd)
    return lower


for _nd in (2, 3):
    xla(f"aten::fractional_max_pool{_nd}d", name=f"fractional_max_pool{_nd}d")(_fractional(_nd))
    xla(f"aten::fractional_max_pool{_nd}d_backward",
        name=f"fractional_max_pool{_nd}d_backward")(_fractional_backward(_nd))


# -- max unpooling ----------------------------------------------------------------------------------
def _unpool(self, indices, output_size):
    nd = len(output_size)
    lead = self.shape[:-nd]
    b = math.prod(lead)
    size = math.prod(output_size)
    # CPU raises for an index outside the output (XLA's scatter would drop it): checked on
    # the device, raised at the next sync
    check((indices >= 0) & (indices < size), "Found an invalid max index (output volumes are of size "
          + "x".join(str(n) for n in output_size) + ")", RuntimeError)
    out = jnp.zeros((b, size), self.dtype)
    planes = self.reshape(b, math.prod(self.shape[-nd:]))    # (not -1: b may be 0)
    out = out.at[jnp.arange(b)[:, None], indices.reshape(planes.shape)].set(planes, mode="drop")
    return out.reshape(lead + tuple(output_size))


@xla("aten::max_unpool2d")
def max_unpool2d(self, indices, output_size):
    return _unpool(self, indices, output_size)


@xla("aten::max_unpool3d")
def max_unpool3d(self, indices, output_size, stride, padding):
    return _unpool(self, indices, output_size)


# -- average pooling --------------------------------------------------------------------------------
def avg_pool_nd(x, outs, kernel_size, stride, padding, count_include_pad, divisor_override):
    """torch's avg_pool over the trailing ``len(outs)`` dims, output spatial size ``outs``."""
    nd = len(outs)
    k = _tup(kernel_size, nd)
    s, p = _tup(stride, nd, k), _tup(padding, nd)
    sizes = x.shape[-nd:]
    lead = x.ndim - nd
    # a window never reaches data past n from its start (>= -p), so one wider than n + p sums
    # the same clipped: a global pool written as AvgPool2d(2560, ceil_mode=True) over 19x19
    # (EfficientNet's head) is then a 19x19 window, not 2560x2560 of padding per output
    kw = tuple(min(kk, n + pp) for kk, n, pp in zip(k, sizes, p))
    # extra high padding for ceil_mode windows that run past the padded input
    extra = [max(0, (o - 1) * st + kk - (n + 2 * pp)) for o, st, kk, n, pp in zip(outs, s, kw, sizes, p)]
    pads = [(0, 0)] * lead + [(pp, pp + e) for pp, e in zip(p, extra)]
    acc = float_compute(x.dtype)
    sums = lax.reduce_window(jnp.pad(x.astype(acc), pads), np.zeros((), acc), lax.add,
                             (1,) * lead + kw, (1,) * lead + s, "VALID")
    sums = sums[(...,) + tuple(slice(0, o) for o in outs)]
    if divisor_override is not None:
        return sums / divisor_override
    return sums / _window_counts(outs, sizes, k, s, p, count_include_pad).astype(acc)


def _window_counts(outs, sizes, k, s, p, count_include_pad: bool) -> np.ndarray:
    """torch's avg_pool divisor at every output position (static shapes: numpy, no XLA
    constant to fold). Per dim, the window [o*s - p, o*s - p + k) is cut at n + p;
    count_include_pad counts the conv padding inside it, never the ceil_mode overhang."""
    counts = np.ones((), np.int64)
    for o, n, kk, st, pp in zip(outs, sizes, k, s, p):
        start = np.arange(o) * st - pp
        end = np.minimum(start + kk, n + pp)
        per_dim = end - start if count_include_pad else np.minimum(end, n) - np.maximum(start, 0)
        counts = np.multiply.outer(counts, per_dim)
    return counts


def _avg_pool(nd):
    def lower(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
        y = avg_pool_nd(self, out_shape()[-nd:], kernel_size, stride, padding, count_include_pad,
                        divisor_override)
        return y.astype(out_dtype())
    return lower


def _avg_pool_backward(nd):
    def lower(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override):
        acc = float_compute(self.dtype)

        def f(x):
            return avg_pool_nd(x, grad_output.shape[-nd:], kernel_size, stride, padding,
                               count_include_pad, divisor_override)
        _, vjp = jax.vjp(f, self.astype(acc))
        return vjp(grad_output.astype(acc))[0].astype(out_dtype())
    return lower


for _nd in (1, 2, 3):
    xla(f"aten::avg_pool{_nd}d", name=f"avg_pool{_nd}d")(_avg_pool(_nd))
for _nd in (2, 3):
    xla(f"aten::avg_pool{_nd}d_backward", name=f"avg_pool{_nd}d_backward")(_avg_pool_backward(_nd))


# -- adaptive average pooling --------------------------------------------------------------------------
def adaptive_avg_pool_nd(x, output_size):
    """torch's adaptive average pool over the trailing ``len(output_size)`` dims."""
    nd = len(output_size)
    acc = float_compute(x.dtype)
    y = x.astype(acc)
    for j, o in enumerate(output_size):
        axis = x.ndim - nd + j
        idx, ok = _adaptive_windows(x.shape[axis], o)
        w = jnp.take(y, jnp.asarray(np.clip(idx, 0, max(x.shape[axis] - 1, 0)).reshape(-1)), axis=axis)
        w = w.reshape(y.shape[:axis] + idx.shape + y.shape[axis + 1:])
        okb = ok.reshape(ok.shape + (1,) * (y.ndim - axis - 1))
        y = jnp.where(okb, w, 0).sum(axis + 1) / ok.sum(1).reshape((-1,) + (1,) * (y.ndim - axis - 1))
    return y


def _adaptive_avg(nd):
    def lower(self, output_size):
        return adaptive_avg_pool_nd(self, tuple(output_size)).astype(out_dtype())
    return lower


def _adaptive_avg_backward(nd):
    def lower(grad_output, self):
        acc = float_compute(self.dtype)
        _, vjp = jax.vjp(lambda x: adaptive_avg_pool_nd(x, grad_output.shape[-nd:]), self.astype(acc))
        return vjp(grad_output.astype(acc))[0].astype(out_dtype())
    return lower


xla("aten::adaptive_avg_pool1d", name="adaptive_avg_pool1d")(_adaptive_avg(1))
for _nd in (2, 3):
    xla(f"aten::_adaptive_avg_pool{_nd}d", name=f"_adaptive_avg_pool{_nd}d")(_adaptive_avg(_nd))
    xla(f"aten::_adaptive_avg_pool{_nd}d_backward",
        name=f"_adaptive_avg_pool{_nd}d_backward")(_adaptive_avg_backward(_nd))


meta_like("fractional_max_pool3d_backward", "self")  # torch ships no Meta kernel for it
