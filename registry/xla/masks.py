"""Mask lowerings: masked_fill, masked_scatter (and its backward), masked_select,
nonzero, nonzero_static, isin.

Out-of-range indices follow ``_index.py``: reads fill 0, writes drop, a deferred check raises as torch.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tpu_kernels.registry.context import check, out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import as_dtype, compute_dtype
from tpu_kernels.registry.xla._index import broadcast_shape, read


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
    # (reads past the source would fill 0: torch refuses, a deferred check)
    check(jnp.count_nonzero(mask) <= source.size, "Number of elements of source < number of ones in mask",
          RuntimeError)
    vals = read(source.reshape(-1).astype(self.dtype), pos).reshape(self.shape)
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
    # a data-dependent op gets no meta check (torch has no meta function for it): CPU's checks
    if mask.dtype != jnp.bool_:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    shape = broadcast_shape(mask.shape, self.shape)   # CPU: expand_outplace(mask, self)
    x, m = jnp.broadcast_to(self, shape), jnp.broadcast_to(mask, shape)
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
