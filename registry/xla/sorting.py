"""Sorting lowerings: sort, topk, searchsorted/bucketize and the data-dependent unique
family (histograms and bincount: ``histogram.py``).

Torch's order: NaN sorts as the largest value (first when descending), -0.0 equals 0.0,
and equal elements keep their original order (torch's stable sort; with ``stable=False``
torch leaves their order unspecified). ``topk`` among equal values returns what torch's
CPU selection algorithm returns (``_cpu_order``): MoE routers depend on it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import kernel_error
from tpu_kernels.registry.xla import _cpu_order


def _sort_keys(x: jax.Array, descending: bool) -> list[jax.Array]:
    """Sort keys whose ascending lexicographic order is torch's order for ``x``."""
    if jnp.issubdtype(x.dtype, jnp.inexact):
        nan = jnp.isnan(x)
        v = jnp.where(nan | (x == 0), jnp.zeros((), x.dtype), x)  # one NaN class, -0 == 0
        return [~nan, -v] if descending else [nan, v]
    return [~x] if descending else [x]  # ~x (= -x - 1 for ints) reverses without overflow


def sort_with_indices(x: jax.Array, axis: int, descending: bool = False) -> tuple[jax.Array, jax.Array]:
    """Stable sort of ``x`` along ``axis`` in torch's order: (values, int64 indices)."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    iota = jax.lax.broadcasted_iota(jnp.int64, x.shape, axis)
    keys = _sort_keys(x, descending)
    out = jax.lax.sort((*keys, x, iota), dimension=axis, is_stable=True, num_keys=len(keys))
    return out[-2], out[-1]


# stable=False: torch leaves the order of equal elements unspecified (its CPU kernel uses
# std::sort or x86-simd-sort); this stable order is one of the allowed ones
@xla("aten::sort.default")
def sort(self, dim=-1, descending=False):
    return sort_with_indices(self, dim % max(self.ndim, 1), descending)


@xla("aten::sort.stable")
def sort_stable(self, *, stable, dim=-1, descending=False):
    return sort_with_indices(self, dim % max(self.ndim, 1), descending)


def _order_key(x: jax.Array, largest: bool) -> jax.Array:
    """An integer key whose descending order is torch's order (largest: NaN first)."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        f = x.astype(jnp.float64 if x.dtype == jnp.float64 else jnp.float32)  # exact
        f = jnp.where(jnp.isnan(f), jnp.nan, jnp.where(f == 0, 0, f))  # +NaN, -0 == 0
        ity = jnp.int64 if f.dtype == jnp.float64 else jnp.int32
        bits = jax.lax.bitcast_convert_type(f, ity)
        # negative floats: flip the magnitude bits so the integer order is the float order
        key = jnp.where(bits < 0, bits ^ jnp.iinfo(ity).max, bits)
    elif x.dtype == jnp.bool_:
        key = x.astype(jnp.int32)
    else:
        key = x
    return key if largest else ~key  # ~k = -k - 1: reverses the order without overflow


@xla("aten::topk.default")
def topk(self, k, dim=-1, largest=True, sorted=True):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    ax = dim % self.ndim
    if jnp.iscomplexobj(self):
        vals, idx = sort_with_indices(self, ax, descending=largest)
        return jax.lax.slice_in_dim(vals, 0, k, axis=ax), jax.lax.slice_in_dim(idx, 0, k, axis=ax)
    x = jnp.moveaxis(self, ax, -1)
    idx = _topk_indices(_order_key(x, largest), k, sorted)
    vals = jnp.take_along_axis(x, idx, axis=-1)
    return jnp.moveaxis(vals, -1, ax), jnp.moveaxis(idx.astype(jnp.int64), -1, ax)


def _topk_indices(key: jax.Array, k: int, sorted: bool) -> jax.Array:
    """torch's CPU top-k indices along the last axis of an order key (larger first).

    Without ties the answer is fixed by the values: ``lax.top_k`` (a TopK op on TPU, not
    a full sort). Equal values among the first k + 1, or the unsorted order of CPU's
    ``nth_element`` path, are whatever CPU's selection algorithm leaves: replayed by
    ``_cpu_order`` (branched to only when ties occur)."""
    n = key.shape[-1]
    if k == 0 or key.size == 0:
        return jax.lax.top_k(key, k)[1]
    if _cpu_order.needs_cpu_order(k, n, sorted):
        return _cpu_order.topk_indices(key, k, sorted)
    top, idx = jax.lax.top_k(key, min(k + 1, n))
    if not _cpu_order.replayable(k, n):
        return idx[..., :k]
    tie = jnp.any(top[..., 1:] == top[..., :-1])
    return jax.lax.cond(tie, lambda: _cpu_order.topk_indices(key, k, sorted).astype(idx.dtype),
                        lambda: idx[..., :k])


# -- searching -----------------------------------------------------------------------------
def _side(right: bool, side: str | None) -> str:
    return side if side is not None else ("right" if right else "left")


def _search(seq: jax.Array, values: jax.Array, side: str, out_int32: bool) -> jax.Array:
    """searchsorted of ``values`` in ``seq`` (1-D, or batched over leading dims)."""
    dt = jnp.int32 if out_int32 else jnp.int64
    if seq.ndim <= 1:
        return jnp.searchsorted(seq, values, side=side).astype(dt)
    lead = seq.shape[:-1]
    fn = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))
    flat = fn(seq.reshape(-1, seq.shape[-1]), values.reshape(-1, values.shape[-1]))
    return flat.reshape(lead + values.shape[-1:]).astype(dt)


@xla("aten::searchsorted.Tensor")
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    seq = sorted_sequence if sorter is None else jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    return _search(seq, self, _side(right, side), out_int32)


@xla("aten::searchsorted.Scalar")
def searchsorted_scalar(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    seq = sorted_sequence if sorter is None else jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    vals = jnp.asarray(self, seq.dtype).reshape(seq.shape[:-1] + (1,))
    res = _search(seq, vals, _side(right, side), out_int32)
    return res.reshape(res.shape[:-1])


@xla("aten::bucketize.Tensor")
def bucketize(self, boundaries, *, out_int32=False, right=False):
    return _search(boundaries, self, "right" if right else "left", out_int32)


@xla("aten::bucketize.Scalar")
def bucketize_scalar(self, boundaries, *, out_int32=False, right=False):
    return _search(boundaries, jnp.asarray(self, boundaries.dtype), "right" if right else "left",
                   out_int32)


# -- unique (data-dependent sizes) -------------------------------------------------------------------
_EMPTY = np.zeros((0,), np.int64)


@xla("aten::_unique2.default", data_dependent=True)
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    # unique values are always sorted here (torch allows, but does not require, unsorted)
    vals, inv, counts = jnp.unique(self.reshape(-1), return_inverse=True, return_counts=True)
    inv = inv.reshape(self.shape).astype(jnp.int64) if return_inverse else jnp.asarray(_EMPTY)
    counts = counts.astype(jnp.int64) if return_counts else jnp.asarray(_EMPTY)
    return vals, inv, counts


@xla("aten::unique_consecutive.default", data_dependent=True)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    x = self.reshape(-1) if dim is None else jnp.moveaxis(self, dim, 0)
    n = x.shape[0]
    if n == 0:
        starts = jnp.zeros((0,), bool)
    elif n == 1:
        starts = jnp.ones((1,), bool)
    else:
        diff = jnp.any((x[1:] != x[:-1]).reshape(n - 1, -1), axis=1)
        starts = jnp.concatenate([jnp.ones((1,), bool), diff])
    where = np.flatnonzero(np.asarray(starts))
    vals = x[where]
    if dim is not None:
        vals = jnp.moveaxis(vals, 0, dim)
    inv = (jnp.cumsum(starts) - 1).astype(jnp.int64)
    inv = (inv.reshape(self.shape) if dim is None else inv) if return_inverse else jnp.asarray(_EMPTY)
    counts = (jnp.diff(jnp.asarray(np.append(where, n))).astype(jnp.int64) if return_counts
              else jnp.asarray(_EMPTY))
    return vals, inv, counts


def _wrap_unique_dim(dim: int, ndim: int) -> int:
    if ndim == 0:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    if not -ndim <= dim < ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], "
                         f"but got {dim})")
    return dim % ndim


@jax.jit
def _unique_rows(rows: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Rows of ``rows`` (n, m) in lexicographic order: (order, first of each run of equal
    rows, inverse, counts padded to n)."""
    n, m = rows.shape
    keys = rows.astype(jnp.uint8) if rows.dtype == jnp.bool_ else rows
    if jnp.issubdtype(keys.dtype, jnp.floating):
        keys = jnp.where(keys == 0, jnp.zeros((), keys.dtype), keys)  # CPU compares with <: -0 == 0

    def by_column(j, order):  # stable sorts from the last column to the first: lexicographic
        _, order = jax.lax.sort((keys[order, m - 1 - j], order), num_keys=1, is_stable=True)
        return order
    order = jax.lax.fori_loop(0, m, by_column, jnp.arange(n, dtype=jnp.int64))
    ranked = rows[order]
    starts = jnp.concatenate([jnp.ones((1,), bool), jnp.any(ranked[1:] != ranked[:-1], axis=1)])
    group = jnp.cumsum(starts, dtype=jnp.int64) - 1
    inverse = jnp.zeros((n,), jnp.int64).at[order].set(group)
    counts = jnp.zeros((n,), jnp.int64).at[group].add(1)
    return order, starts, inverse, counts


@xla("aten::unique_dim.default", data_dependent=True)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    """Unique slices along ``dim``, in lexicographic order (CPU always sorts). Like CPU, the
    inverse and counts are returned whatever the flags say; rows with a NaN are all distinct."""
    if jnp.iscomplexobj(self):
        raise kernel_error("unique_dim", self.dtype)
    dim = _wrap_unique_dim(dim, self.ndim)
    zero_dims = self.shape.count(0)
    if self.shape[dim] == 0:
        if zero_dims > 1:
            raise RuntimeError("Number of zero sized dimensions is more than one, so unique cannot be applied ")
        return self, jnp.asarray(_EMPTY), jnp.asarray(_EMPTY)
    if zero_dims:
        raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique cannot be applied")
    x = jnp.moveaxis(self, dim, 0)
    order, starts, inverse, counts = _unique_rows(x.reshape(x.shape[0], -1))
    first = np.flatnonzero(np.asarray(starts))
    vals = jnp.moveaxis(x[order[first]], 0, dim)
    return vals, inverse, counts[:len(first)]
