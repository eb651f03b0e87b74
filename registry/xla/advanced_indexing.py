"""Advanced indexing lowerings: index (integer and mask indices), index_put,
_unsafe_masked_index(_put_accumulate), take, put. Negative indices wrap as in torch.

Out-of-range indices follow ``_index.py``: reads fill 0, writes drop, a deferred check raises as torch.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from tpu_kernels.registry.context import check
from tpu_kernels.registry.dtypes import to_torch_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import as_dtype
from tpu_kernels.registry.xla._index import add_at, check_masks, in_range, read


def _check_coords(x_shape, indices) -> None:
    for d, ix in enumerate(indices):
        if ix is not None and hasattr(ix, "dtype") and ix.dtype not in (jnp.bool_, jnp.uint8):
            in_range(ix, x_shape[d], f"index is out of bounds for dimension {d} with size "
                     f"{x_shape[d]}", negative=True)


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
    return read(self, _coords(indices))


@xla("aten::index.Tensor", "aten::_unsafe_index.Tensor", data_dependent=True, name="index_mask")
def index_mask(self, indices):
    """Boolean masks make the shape data-dependent: run eagerly, masks -> nonzero."""
    check_masks(self.shape, indices)
    out = []
    for ix in indices:
        out.extend(np.nonzero(np.asarray(ix)) if _is_mask(ix) else [ix])
    _check_coords(self.shape, out)   # the integer indices beside the masks
    return read(self, _coords(out))


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
    if len(bshape) == 1 and 0 <= axis < values.ndim and values.shape[axis] != 1:
        _check_value_count(indices, values.shape, values.shape[axis])
    if len(bshape) == 1 and 0 <= axis < values.ndim and values.shape[axis] not in (1, padded):
        pad = [(0, 0)] * values.ndim
        pad[axis] = (0, padded - values.shape[axis])
        values = jnp.pad(values, pad)
    return tuple(coords), values


def _check_value_count(indices, value_shape: tuple, n: int) -> None:
    """Values given per selected element (``n`` along the selected axis) must be as many as
    the mask's true elements (torch: a shape mismatch); else the padded write would assign
    the wrong ones. The count is on the device: a deferred check."""
    masks = [ix for ix in indices if _is_mask(ix)]
    if len(masks) == 1:
        check(jnp.count_nonzero(masks[0]) == n,
              f"shape mismatch: value tensor of shape {list(value_shape)} cannot be broadcast to "
              f"indexing result of shape [k, ...] where k, the number of True elements of the "
              f"mask, is not {n}", RuntimeError)


@xla("aten::index_put", "aten::index_put_", "aten::_unsafe_index_put")
def index_put(self, indices, values, accumulate=False):
    # without accumulate, duplicate indices leave the winner undefined (as in torch)
    if values.dtype != self.dtype:  # torch's meta function lets this through; its kernel raises
        raise RuntimeError(
            f"index_put: Index put requires the source and destination dtypes match, got "
            f"{to_torch_dtype(self.dtype)} for the destination and {to_torch_dtype(values.dtype)} "
            f"for the source.")
    check_masks(self.shape, indices)
    _check_coords(self.shape, indices)
    coords, values = _static_mask_coords(self.shape, indices, values.astype(self.dtype))
    ref = self.at[coords]
    return add_at(ref, values) if accumulate else ref.set(values, mode="drop")


@xla("aten::_unsafe_masked_index")
def unsafe_masked_index(self, mask, indices, fill):
    return jnp.where(mask, read(self, _coords(indices)), as_dtype(fill, self.dtype))


@xla("aten::_unsafe_masked_index_put_accumulate")
def unsafe_masked_index_put_accumulate(self, mask, indices, values):
    vals = jnp.where(mask, values.astype(self.dtype), jnp.zeros((), self.dtype))
    return self.at[_coords(indices)].add(vals, mode="drop")


@xla("aten::take")
def take(self, index):
    in_range(index, self.size, f"out of range: tried to access index outside a tensor of "
              f"{self.size} elements", negative=True)
    return read(self.reshape(-1), index)


@xla("aten::put", "aten::put_")
def put(self, index, source, accumulate=False):
    in_range(index, self.size, f"out of range: tried to access index outside a tensor of "
              f"{self.size} elements", negative=True)
    ref = self.reshape(-1).at[index.reshape(-1)]
    src = source.reshape(-1).astype(self.dtype)
    flat = add_at(ref, src) if accumulate else ref.set(src, mode="drop")
    return flat.reshape(self.shape)
