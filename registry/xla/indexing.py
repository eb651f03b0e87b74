"""Indexing lowerings: gather/scatter families, advanced indexing, masks, embeddings.

Out-of-range indices: XLA would clamp them silently. Until device-side error flags
exist, every read here uses ``mode="fill"`` (out-of-range reads give 0) and every
write ``mode="drop"`` (out-of-range writes are skipped), consistently. Negative indices
wrap as in torch where torch allows them (advanced indexing, take, put).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_kernels.registry.context import check, out_dtype, out_shape
from tpu_kernels.registry.dtypes import to_torch_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import as_dtype, compute_dtype


def _dim(d: int, ndim: int) -> int:
    return d % max(ndim, 1)


def _add_at(ref, values):
    """``x.at[idx].add(values)``; torch adds bools as logical or (XLA has no bool add)."""
    if ref.array.dtype == jnp.bool_:
        return ref.max(values.astype(jnp.bool_), mode="drop")
    return ref.add(values, mode="drop")


def _in_range(index: jax.Array, size: int, what: str, *, negative: bool = False,
              exc: type = IndexError) -> None:
    """XLA fills or drops out-of-range indices silently; torch raises: check (deferred)."""
    lo = -size if negative else 0
    check((index >= lo) & (index < size), f"{what} (an index is outside [{lo}, {size}))", exc)


def _check_coords(x_shape, indices) -> None:
    for d, ix in enumerate(indices):
        if ix is not None and hasattr(ix, "dtype") and ix.dtype not in (jnp.bool_, jnp.uint8):
            _in_range(ix, x_shape[d], f"index is out of bounds for dimension {d} with size "
                      f"{x_shape[d]}", negative=True)


def _read(x: jax.Array, idx) -> jax.Array:
    return x.at[idx].get(mode="fill", fill_value=0)


def _along(index: jax.Array, dim: int) -> tuple:
    """Full scatter/gather coordinates: ``index`` along ``dim``, positions elsewhere."""
    return tuple(index if d == dim else lax.broadcasted_iota(jnp.int64, index.shape, d)
                 for d in range(index.ndim))


def _at_dim(ndim: int, dim: int, index) -> tuple:
    return (slice(None),) * dim + (index,) + (slice(None),) * (ndim - dim - 1)


def _as_1d(*xs):
    return [x.reshape(1) if x is not None and hasattr(x, "ndim") and x.ndim == 0 else x for x in xs]


# -- gather / scatter ------------------------------------------------------------------------
@xla("aten::gather")
def gather(self, dim, index, *, sparse_grad=False):
    if self.ndim == 0:
        self, index = _as_1d(self, index)
    d = _dim(dim, self.ndim)
    _in_range(index, self.shape[d], f"index out of bounds for dimension {d} with size "
              f"{self.shape[d]}", exc=RuntimeError)
    return _read(self, _along(index, d)).reshape(out_shape())


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
    _in_range(index, x.shape[d], f"index out of bounds for dimension {d} with size {x.shape[d]}",
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
    return _add_at(x.at[coords], _src_for(src, index, x.dtype)).reshape(self.shape)


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
    _in_range(index, x.shape[d], "index out of range in self",
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
    _in_range(index, x.shape[dim], f"index is out of bounds for dimension {dim} with size "
              f"{x.shape[dim]}", negative=negative, exc=exc)
    shape = x.shape[:dim] + (index.shape[0],) + x.shape[dim + 1:]
    src = jnp.broadcast_to(as_dtype(source, x.dtype), shape) if not hasattr(source, "ndim") \
        or source.ndim == 0 else source.astype(x.dtype).reshape(shape)
    ref = x.at[_at_dim(x.ndim, dim, index)]
    out = _add_at(ref, src) if how == "add" else getattr(ref, how)(src, mode="drop")
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
    _in_range(index, x.shape[dim], "index out of range in self")
    shape = [1] * src.ndim
    shape[dim] = -1
    full = jnp.broadcast_to(index.reshape(shape), src.shape)
    out = _scatter_reduce(x, _along(full, dim), src.astype(x.dtype), reduce, include_self)
    return out.reshape(self.shape)


# -- advanced indexing ---------------------------------------------------------------------------
def _is_mask(ix) -> bool:
    return ix is not None and ix.dtype in (jnp.bool_, jnp.uint8)


def _no_mask(self, indices, *args, **kwargs):
    """supports(): masks make the result shape data-dependent (the eager impl takes them)."""
    return "boolean mask index (data-dependent shape)" if any(
        i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices) else True


def _coords(indices) -> tuple:
    """torch's ``Tensor?[]`` indices as a numpy-style index tuple (None skips a dim)."""
    return tuple(slice(None) if ix is None else ix for ix in indices)


@xla("aten::index.Tensor", "aten::_unsafe_index.Tensor", supports=_no_mask)
def index(self, indices):
    _check_coords(self.shape, indices)
    return _read(self, _coords(indices))


@xla("aten::index.Tensor", "aten::_unsafe_index.Tensor", data_dependent=True, name="index_mask")
def index_mask(self, indices):
    """Boolean masks make the shape data-dependent: run eagerly, masks -> nonzero."""
    out = []
    for ix in indices:
        out.extend(np.nonzero(np.asarray(ix)) if _is_mask(ix) else [ix])
    return _read(self, _coords(out))


def _static_mask_coords(self_shape, indices, values):
    """Masks as padded nonzero coordinates (jittable), and ``values`` padded to match.

    A mask with P elements becomes P coordinates: its true positions first, then an
    out-of-range fill that ``mode="drop"`` discards. ``values`` given per selected
    element (count k) is zero-padded to P along the selected axis.
    """
    coords, padded, d = [], None, 0
    for ix in indices:
        if _is_mask(ix):
            fill = max(self_shape[d:d + ix.ndim] or (1,))
            coords.extend(jnp.nonzero(ix, size=ix.size, fill_value=fill))
            padded = ix.size
            d += ix.ndim
        else:
            coords.append(slice(None) if ix is None else ix)
            d += 1
    if padded is None or not hasattr(values, "ndim"):
        return tuple(coords), values
    adv = [i for i, c in enumerate(coords) if not isinstance(c, slice)]
    pos = adv[0] if adv == list(range(adv[0], adv[-1] + 1)) else 0
    bshape = jnp.broadcast_shapes(*(coords[i].shape for i in adv))
    n_sliced = sum(isinstance(c, slice) for c in coords) + len(self_shape) - d
    result_ndim = n_sliced + len(bshape)
    axis = pos + len(bshape) - 1 - (result_ndim - values.ndim)
    if len(bshape) == 1 and 0 <= axis < values.ndim and values.shape[axis] not in (1, padded):
        pad = [(0, 0)] * values.ndim
        pad[axis] = (0, padded - values.shape[axis])
        values = jnp.pad(values, pad)
    return tuple(coords), values


@xla("aten::index_put", "aten::index_put_", "aten::_unsafe_index_put")
def index_put(self, indices, values, accumulate=False):
    # without accumulate, duplicate indices leave the winner undefined (as in torch)
    if values.dtype != self.dtype:  # torch's meta function lets this through; its kernel raises
        raise RuntimeError(
            f"index_put: Index put requires the source and destination dtypes match, got "
            f"{to_torch_dtype(self.dtype)} for the destination and {to_torch_dtype(values.dtype)} "
            f"for the source.")
    _check_coords(self.shape, indices)
    coords, values = _static_mask_coords(self.shape, indices, values.astype(self.dtype))
    ref = self.at[coords]
    return _add_at(ref, values) if accumulate else ref.set(values, mode="drop")


@xla("aten::_unsafe_masked_index")
def unsafe_masked_index(self, mask, indices, fill):
    return jnp.where(mask, _read(self, _coords(indices)), as_dtype(fill, self.dtype))


@xla("aten::_unsafe_masked_index_put_accumulate")
def unsafe_masked_index_put_accumulate(self, mask, indices, values):
    vals = jnp.where(mask, values.astype(self.dtype), jnp.zeros((), self.dtype))
    return self.at[_coords(indices)].add(vals, mode="drop")


@xla("aten::take")
def take(self, index):
    _in_range(index, self.size, f"out of range: tried to access index outside a tensor of "
              f"{self.size} elements", negative=True)
    return _read(self.reshape(-1), index)


@xla("aten::put", "aten::put_")
def put(self, index, source, accumulate=False):
    _in_range(index, self.size, f"out of range: tried to access index outside a tensor of "
              f"{self.size} elements", negative=True)
    ref = self.reshape(-1).at[index.reshape(-1)]
    src = source.reshape(-1).astype(self.dtype)
    flat = _add_at(ref, src) if accumulate else ref.set(src, mode="drop")
    return flat.reshape(self.shape)


# -- masks --------------------------------------------------------------------------------------
@xla("aten::masked_fill.Scalar", "aten::masked_fill.Tensor", "aten::masked_fill_.Scalar",
     "aten::masked_fill_.Tensor")
def masked_fill(self, mask, value):
    dt = out_dtype()
    return jnp.where(mask, as_dtype(value, dt), self.astype(dt))


@xla("aten::masked_scatter", "aten::masked_scatter_")
def masked_scatter(self, mask, source):
    """Masked positions (row-major) take consecutive elements of ``source``."""
    mask = jnp.broadcast_to(mask, self.shape)
    pos = jnp.cumsum(mask.reshape(-1)) - 1
    vals = _read(source.reshape(-1).astype(self.dtype), pos).reshape(self.shape)
    return jnp.where(mask, vals, self)


@xla("aten::masked_scatter_backward")
def masked_scatter_backward(grad_output, mask, sizes):
    n = int(np.prod(sizes))
    mask = jnp.broadcast_to(mask, grad_output.shape).reshape(-1)
    pos = jnp.where(mask, jnp.cumsum(mask) - 1, n)
    packed = jnp.zeros((n,), grad_output.dtype).at[pos].set(grad_output.reshape(-1), mode="drop")
    return packed.reshape(tuple(sizes))


@xla("aten::masked_select", data_dependent=True)
def masked_select(self, mask):
    x, m = jnp.broadcast_arrays(self, mask)
    return x.reshape(-1)[np.flatnonzero(np.asarray(m))]


@xla("aten::nonzero", data_dependent=True)
def nonzero(self):
    # the shape is only known from the values: count on the host (one sync)
    return jnp.asarray(np.argwhere(np.asarray(self)), jnp.int64)


@xla("aten::nonzero_static")
def nonzero_static(self, *, size, fill_value=-1):
    x = self.reshape(1) if self.ndim == 0 else self
    coords = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(coords, axis=1).astype(jnp.int64)[:, :self.ndim]


@xla("aten::isin.Tensor_Tensor", "aten::isin.Tensor_Scalar", "aten::isin.Scalar_Tensor")
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    dt = compute_dtype(elements, test_elements)
    e = as_dtype(elements, dt)
    table = jnp.sort(jnp.ravel(as_dtype(test_elements, dt)))
    if table.shape[0] == 0:
        found = jnp.zeros(jnp.shape(e), jnp.bool_)
    else:
        pos = jnp.clip(jnp.searchsorted(table, e), 0, table.shape[0] - 1)
        found = table[pos] == e
    return ~found if invert else found


# -- embeddings ------------------------------------------------------------------------------------
@xla("aten::embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    _in_range(indices, weight.shape[0], "index out of range in self")
    return jnp.take(weight, indices, axis=0, mode="fill", fill_value=0)


@xla("aten::embedding_dense_backward")
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """Scatter-add of the output gradient rows into the weight rows they came from."""
    acc = jnp.float32 if grad_output.dtype in (jnp.bfloat16, jnp.float16) else grad_output.dtype
    idx = indices.reshape(-1)
    g = grad_output.reshape((idx.shape[0], -1)).astype(acc)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), acc).at[idx].add(1, mode="drop")
        g = g / _read(counts, idx)[:, None]
    keep = (idx != padding_idx) if padding_idx >= 0 else jnp.ones_like(idx, jnp.bool_)
    g = jnp.where(keep[:, None], g, 0)
    out = jnp.zeros((num_weights, g.shape[1]), acc).at[idx].add(g, mode="drop")
    return out.reshape(out_shape()).astype(out_dtype())


@xla("aten::_embedding_bag", "aten::_embedding_bag_forward_only")
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Bags of embedding rows reduced by sum (0), mean (1) or max (2).

    Returns (output, offset2bag, bag_size, max_indices) with the shapes of torch's meta
    function; values as the CPU kernel (bag_size is 0 in sum mode, as there)."""
    n = indices.shape[0]
    starts = offsets[:-1] if include_last_offset else offsets
    bags = starts.shape[0]
    pos = jnp.arange(n)
    bag = jnp.searchsorted(starts, pos, side="right") - 1        # last bag starting at or before
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones((n,), jnp.bool_)
    acc = jnp.float32 if weight.dtype in (jnp.bfloat16, jnp.float16) else weight.dtype
    rows = jnp.take(weight, indices, axis=0, mode="fill", fill_value=0).astype(acc)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(acc)[:, None]
    count = jax.ops.segment_sum(valid.astype(jnp.int64), bag, bags)
    dt = out_dtype(0)
    # with include_last_offset the meta function gives bag_size one entry per offset
    sizes = jnp.pad(count, (0, out_shape(2)[0] - bags))
    if mode == 2:
        masked = jnp.where(valid[:, None], rows, -jnp.inf)
        top = jax.ops.segment_max(masked, bag, bags)
        first = jax.ops.segment_min(jnp.where((masked == top[bag]) & valid[:, None], pos[:, None], n), bag, bags)
        max_idx = jnp.where(count[:, None] > 0, _read(indices, first), 0)
        out = jnp.where(count[:, None] > 0, top, 0)
        return out.astype(dt), bag, sizes, max_idx
    out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), bag, bags)
    if mode == 1:
        out = out / jnp.maximum(count, 1)[:, None].astype(acc)
    bag_size = sizes if mode == 1 else jnp.zeros_like(sizes)
    return out.astype(dt), bag, bag_size, jnp.zeros(out_shape(3), jnp.int64)
