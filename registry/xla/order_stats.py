"""Order-statistic lowerings: median, nanmedian, kthvalue, mode."""
from __future__ import annotations


import jax
import jax.numpy as jnp
import torch

from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import to_torch_dtype
from tpu_kernels.registry.xla._reduce import is_float, one_axis


def _sorted_along(x: jax.Array, ax: int) -> tuple[jax.Array, jax.Array]:
    """Stable ascending sort along ``ax`` with NaN last: (values, int64 indices)."""
    from tpu_kernels.registry.xla.sorting import sort_with_indices
    return sort_with_indices(x, ax, descending=False)


def _pick(vals, idx, pos, ax, keepdim):
    """values/indices at per-slice position ``pos`` (shape of the reduced result, kept)."""
    v = jnp.take_along_axis(vals, pos, axis=ax)
    i = jnp.take_along_axis(idx, pos, axis=ax)
    return (v, i) if keepdim else (jnp.squeeze(v, ax), jnp.squeeze(i, ax))


def _nan_first_index(x, ax):
    """Index of the first NaN along ``ax`` (keepdims), and whether there is one."""
    isn = jnp.isnan(x) if is_float(x) else jnp.zeros(x.shape, bool)
    return jnp.argmax(isn, axis=ax, keepdims=True), jnp.any(isn, axis=ax, keepdims=True)


def _median_dim(self, dim, keepdim, ignore_nan: bool):
    ax = one_axis(dim, self.ndim)
    if ax is None:
        return self, jnp.zeros((), jnp.int64)
    if self.shape[ax] == 0:  # torch's words for median and nanmedian alike
        raise IndexError(f"median(): Expected reduction dim {ax} to have non-zero size.")
    vals, idx = _sorted_along(self, ax)
    n = self.shape[ax]
    if ignore_nan and is_float(self):
        k = jnp.sum(~jnp.isnan(self), axis=ax, keepdims=True)
        pos = jnp.maximum(k - 1, 0) // 2
    else:
        pos = jnp.full(vals.shape[:ax] + (1,) + vals.shape[ax + 1:], (n - 1) // 2)
        first_nan, has_nan = _nan_first_index(self, ax)
    v, i = _pick(vals, idx, pos, ax, True)
    if not ignore_nan and is_float(self):  # NaN wins, at the first NaN's index
        v, i = jnp.where(has_nan, jnp.nan, v).astype(v.dtype), jnp.where(has_nan, first_nan, i)
    return (v, i) if keepdim else (jnp.squeeze(v, ax), jnp.squeeze(i, ax))


@xla("aten::median.dim")
def median_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, ignore_nan=False)


@xla("aten::nanmedian.dim")
def nanmedian_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, ignore_nan=True)


def _empty_median(dt) -> jax.Array:
    """torch's median of no elements: NaN cast to the dtype. The cast runs in torch on the
    host, so integer dtypes get what CPU torch's cast gives (INT64_MIN, True for bool...)."""
    return jnp.asarray(torch.tensor(float("nan")).to(to_torch_dtype(dt)).item(), dt)


@xla("aten::median.default")
def median(self):
    if self.size == 0:
        return _empty_median(self.dtype)
    return _median_dim(self.reshape(-1), 0, False, ignore_nan=False)[0]


@xla("aten::nanmedian.default")
def nanmedian(self):
    if self.size == 0:
        return _empty_median(self.dtype)
    return _median_dim(self.reshape(-1), 0, False, ignore_nan=True)[0]


@xla("aten::kthvalue.default")
def kthvalue(self, k, dim=-1, keepdim=False):
    ax = one_axis(dim, self.ndim)
    if ax is None:
        return self, jnp.zeros((), jnp.int64)
    vals, idx = _sorted_along(self, ax)
    v = jax.lax.slice_in_dim(vals, k - 1, k, axis=ax)
    i = jax.lax.slice_in_dim(idx, k - 1, k, axis=ax)
    return (v, i) if keepdim else (jnp.squeeze(v, ax), jnp.squeeze(i, ax))


@xla("aten::mode.default")
def mode(self, dim=-1, keepdim=False):
    """Most frequent value (smallest among equally frequent), index of its last occurrence."""
    ax = one_axis(dim, self.ndim)
    if ax is None:
        return self, jnp.zeros((), jnp.int64)
    vals, idx = _sorted_along(self, ax)
    vals, idx = jnp.moveaxis(vals, ax, -1), jnp.moveaxis(idx, ax, -1)
    n = vals.shape[-1]
    pos = jnp.arange(n)
    same = vals[..., 1:] == vals[..., :-1]
    if is_float(vals):
        same = same | (jnp.isnan(vals[..., 1:]) & jnp.isnan(vals[..., :-1]))
    starts = jnp.concatenate([jnp.ones(vals.shape[:-1] + (1,), bool), ~same], axis=-1)
    run_start = jax.lax.cummax(jnp.where(starts, pos, 0), axis=vals.ndim - 1)
    count = pos - run_start + 1
    # the end of the first longest run: count first reaches its max there
    end = jnp.argmax(count, axis=-1, keepdims=True)
    first = jnp.take_along_axis(run_start, end, axis=-1)
    # torch returns the largest original index among the run's elements
    in_run = (pos >= first) & (pos <= end)
    i = jnp.max(jnp.where(in_run, idx, -1), axis=-1, keepdims=True)
    v = jnp.take_along_axis(vals, end, axis=-1)
    v, i = jnp.moveaxis(v, -1, ax), jnp.moveaxis(i, -1, ax)
    return (v, i) if keepdim else (jnp.squeeze(v, ax), jnp.squeeze(i, ax))
