"""Gather and scatter lowerings, and the ``index_*`` ops along one dim: gather, scatter
(src, value, reduce), scatter_add, scatter_reduce, index_select, index_add, index_copy,
index_fill, index_reduce.

Out-of-range indices follow ``_index.py``: reads fill 0, writes drop, a deferred check raises as torch.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from tpu_kernels.registry.context import out_shape
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import as_dtype
from tpu_kernels.registry.xla._index import add_at, in_range, read


def _dim(d: int, ndim: int) -> int:
    return d % max(ndim, 1)


def _along(index: jax.Array, dim: int) -> tuple:
    """Full scatter/gather coordinates: ``index`` along ``dim``, positions elsewhere."""
    return tuple(index if d == dim else lax.broadcasted_iota(jnp.int64, index.shape, d)
                 for d in range(index.ndim))


def _at_dim(ndim: int, dim: int, index) -> tuple:
    return (slice(None),) * dim + (index,) + (slice(None),) * (ndim - dim - 1)


def _as_1d(*xs):
    return [x.reshape(1) if x is not None and hasattr(x, "ndim") and x.ndim == 0 else x for x in xs]


@xla("aten::gather")
def gather(self, dim, index, *, sparse_grad=False):
    if self.ndim == 0:
        self, index = _as_1d(self, index)
    d = _dim(dim, self.ndim)
    in_range(index, self.shape[d], f"index out of bounds for dimension {d} with size "
              f"{self.shape[d]}", exc=RuntimeError)
    return read(self, _along(index, d)).reshape(out_shape())


def _src_for(src, index: jax.Array, dtype) -> jax.Array:
    """``src`` cut to ``index``'s shape (torch allows a larger src), or a broadcast scalar."""
    if not hasattr(src, "ndim") or src.ndim == 0:
        return jnp.broadcast_to(as_dtype(src, dtype), index.shape)
    return src[tuple(slice(0, n) for n in index.shape)].astype(dtype)


_REDUCE_AT = {"sum": "add", "add": "add", "prod": "multiply", "multiply": "multiply",
              "amax": "max", "amin": "min", "mean": "add"}


def _identity(reduce: str, dtype) -> jax.Array:
    if reduce in ("amax", "amin"):
        if jnp.issubdtype(dtype, jnp.floating):
            v = -jnp.inf if reduce == "amax" else jnp.inf
        elif dtype == jnp.bool_:
            v = reduce == "amin"
        else:
            info = jnp.iinfo(dtype)
            v = info.min if reduce == "amax" else info.max
        return jnp.asarray(v, dtype)
    return jnp.asarray(1 if reduce in ("prod", "multiply") else 0, dtype)


def _scatter_coords(self, dim: int, index: jax.Array) -> tuple:
    """(self as >= 1-d, index, full coordinates) for a scatter along ``dim``; checks range."""
    x, index = _as_1d(self, index) if self.ndim == 0 else (self, index)
    d = _dim(dim, x.ndim)
    in_range(index, x.shape[d], f"index out of bounds for dimension {d} with size {x.shape[d]}",
             exc=RuntimeError)
    return x, index, _along(index, d)


def _scatter_reduce(self, coords: tuple, src, reduce: str, include_self: bool = True):
    """``self`` with ``src`` reduced into ``coords`` (torch's scatter_reduce semantics)."""
    base = self if include_self else self.at[coords].set(_identity(reduce, self.dtype), mode="drop")
    out = getattr(base.at[coords], _REDUCE_AT[reduce])(src, mode="drop")
    if reduce != "mean":
        return out
    count = jnp.zeros(self.shape, jnp.int64).at[coords].add(1, mode="drop")
    count = count + (1 if include_self else 0)
    if jnp.issubdtype(self.dtype, jnp.integer):
        mean = jnp.floor_divide(out, jnp.maximum(count, 1).astype(self.dtype))
    else:
        mean = out / jnp.maximum(count, 1).astype(self.dtype)
    return jnp.where(count > 0, mean, self).astype(self.dtype)


@xla("aten::scatter.src", "aten::scatter.value", "aten::scatter_.src", "aten::scatter_.value")
def scatter(self, dim, index, src):
    # duplicate indices: torch leaves the winner undefined; XLA picks one
    x, index, coords = _scatter_coords(self, dim, index)
    return x.at[coords].set(_src_for(src, index, x.dtype), mode="drop").reshape(self.shape)


@xla("aten::scatter.reduce", "aten::scatter.value_reduce", "aten::scatter_.reduce",
     "aten::scatter_.value_reduce")
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    x, index, coords = _scatter_coords(self, dim, index)
    return _scatter_reduce(x, coords, _src_for(src, index, x.dtype), reduce).reshape(self.shape)


@xla("aten::scatter_add", "aten::scatter_add_")
def scatter_add(self, dim, index, src):
    x, index, coords = _scatter_coords(self, dim, index)
    return add_at(x.at[coords], _src_for(src, index, x.dtype)).reshape(self.shape)


@xla("aten::scatter_reduce.two", "aten::scatter_reduce_.two")
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    x, index, coords = _scatter_coords(self, dim, index)
    return _scatter_reduce(x, coords, _src_for(src, index, x.dtype), reduce,
                           include_self).reshape(self.shape)


# -- index_* along one dim -----------------------------------------------------------------------
@xla("aten::index_select")
def index_select(self, dim, index):
    x = self.reshape(1) if self.ndim == 0 else self
    d = _dim(dim, x.ndim)
    # CPU torch's dim-1 kernel reports a RuntimeError, the others an IndexError
    in_range(index, x.shape[d], "index out of range in self",
             exc=RuntimeError if d == 1 and x.ndim > 1 else IndexError)
    return jnp.take(x, index.reshape(-1), axis=_dim(dim, x.ndim), mode="fill",
                    fill_value=0).reshape(out_shape())


def _index_dim_update(self, dim, index, source, how: str, *, negative: bool = False,
                      exc: type = IndexError):
    """``self.at[..., index, ...]`` along ``dim`` updated with ``source`` by ``how``.

    As in torch's CPU kernels, only index_fill takes negative indices, and index_add
    reports a bad index as a RuntimeError (index_copy and index_fill: IndexError)."""
    x = self.reshape(1) if self.ndim == 0 else self
    dim = _dim(dim, x.ndim)
    index = index.reshape(-1)
    in_range(index, x.shape[dim], f"index is out of bounds for dimension {dim} with size "
              f"{x.shape[dim]}", negative=negative, exc=exc)
    shape = x.shape[:dim] + (index.shape[0],) + x.shape[dim + 1:]
    src = jnp.broadcast_to(as_dtype(source, x.dtype), shape) if not hasattr(source, "ndim") \
        or source.ndim == 0 else source.astype(x.dtype).reshape(shape)
    ref = x.at[_at_dim(x.ndim, dim, index)]
    out = add_at(ref, src) if how == "add" else getattr(ref, how)(src, mode="drop")
    return out.reshape(self.shape)


@xla("aten::index_add", "aten::index_add_")
def index_add(self, dim, index, source, *, alpha=1):
    src = source.astype(self.dtype) * as_dtype(alpha, self.dtype)
    # CPU torch: IndexError for a 1-d self, RuntimeError otherwise
    return _index_dim_update(self, dim, index, src, "add",
                             exc=IndexError if self.ndim <= 1 else RuntimeError)


@xla("aten::index_copy", "aten::index_copy_")
def index_copy(self, dim, index, source):
    return _index_dim_update(self, dim, index, source, "set")


@xla("aten::index_fill.int_Scalar", "aten::index_fill.int_Tensor",
     "aten::index_fill_.int_Scalar", "aten::index_fill_.int_Tensor")
def index_fill(self, dim, index, value):
    return _index_dim_update(self, dim, index, value, "set", negative=True)


@xla("aten::index_reduce", "aten::index_reduce_")
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    x = self.reshape(1) if self.ndim == 0 else self
    src = source.reshape(x.shape[:0] + (-1,)) if source.ndim == 0 else source
    dim = _dim(dim, x.ndim)
    in_range(index, x.shape[dim], "index out of range in self")
    shape = [1] * src.ndim
    shape[dim] = -1
    full = jnp.broadcast_to(index.reshape(shape), src.shape)
    out = _scatter_reduce(x, _along(full, dim), src.astype(x.dtype), reduce, include_self)
    return out.reshape(self.shape)
