"""Factories and fills: empty, zeros, ones, full, arange, *_like, fill_, zero_, clone."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tpu_kernels.registry.context import out_dtype, out_shape
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import cast

@xla("aten::empty.memory_format", "aten::empty_strided", "aten::zeros", "aten::empty_like",
     "aten::zeros_like", "aten::new_zeros", "aten::new_empty", "aten::new_empty_strided",
     "aten::empty_permuted", "aten::_efficientzerotensor")
def zeros(*args, **kwargs):
    # "empty" is zero-filled: deterministic, and free under XLA. _efficientzerotensor (the
    # zero tangents of forward-mode AD, jacfwd) is a plain zero tensor: the same values,
    # without ZeroTensor's skipped arithmetic
    return jnp.zeros(out_shape(), out_dtype())


@xla("aten::ones", "aten::ones_like", "aten::new_ones")
def ones(*args, **kwargs):
    return jnp.ones(out_shape(), out_dtype())


@xla("aten::full")
def full(size, fill_value, **kwargs):
    return jnp.full(out_shape(), fill_value, out_dtype())


@xla("aten::full_like")
def full_like(self, fill_value, **kwargs):
    return jnp.full(out_shape(), fill_value, out_dtype())


@xla("aten::new_full")
def new_full(self, size, fill_value, **kwargs):
    return jnp.full(out_shape(), fill_value, out_dtype())


@xla("aten::scalar_tensor")
def scalar_tensor(s, **kwargs):
    return jnp.asarray(s).astype(out_dtype())


@xla("aten::arange.default", "aten::arange.start", "aten::arange.start_step",
     static=("start", "end", "step"))
def arange(*args, **kwargs):
    start, end, step = _arange_bounds(args)
    n = out_shape()[0]
    dt = out_dtype()
    if jnp.issubdtype(dt, jnp.integer):
        return (start + step * jnp.arange(n, dtype=jnp.int64)).astype(dt)
    # float arange: start + i*step computed in double, like torch's CPU kernel
    return (start + step * jnp.arange(n, dtype=jnp.float64)).astype(dt)


def _arange_bounds(args):
    nums = [a for a in args if isinstance(a, (int, float, bool))]
    if len(nums) == 1:
        return 0, nums[0], 1
    if len(nums) == 2:
        return nums[0], nums[1], 1
    return nums[0], nums[1], nums[2]


@xla("aten::fill.Scalar", "aten::fill_.Scalar")
def fill_scalar(self, value):
    return jnp.full(self.shape, value, out_dtype())


@xla("aten::fill.Tensor", "aten::fill_.Tensor")
def fill_tensor(self, value):
    return jnp.broadcast_to(value.astype(out_dtype()), self.shape)


@xla("aten::zero_")
def zero_(self):
    return jnp.zeros_like(self)


# prims::convert_element_type: compiled graphs with dynamic shapes carry a Python float
# argument (a SymFloat) as a float64 scalar converted to the compute dtype
@xla("aten::clone", "aten::_to_copy", "aten::alias_copy", "aten::lift_fresh_copy", "prims::convert_element_type")
def clone(self, *args, **kwargs):
    return cast(self, out_dtype())


@xla("aten::copy_", "aten::copy")
def copy(self, src, non_blocking=False):
    return jnp.broadcast_to(cast(src, self.dtype), self.shape)


@xla("aten::eye", "aten::eye.m")
def eye(n, m=None, **kwargs):
    return jnp.eye(n, m, dtype=out_dtype())


def _linspace_values(start, end, steps: int, dt):
    """torch's symmetric linspace: from ``start`` for the first half, from ``end`` after,
    so both ends are exact; integers and half types compute in float64/float32."""
    if steps == 1:
        return jnp.reshape(start, (1,)).astype(dt)
    cdt = dt if dt in (jnp.float32, jnp.float64) else jnp.float64
    start, end = jnp.asarray(start).astype(cdt), jnp.asarray(end).astype(cdt)
    step = (end - start) / (steps - 1)
    i = jnp.arange(steps)
    return jnp.where(i < steps / 2, start + step * i.astype(cdt),
                     end - step * (steps - 1 - i).astype(cdt))


@xla("aten::linspace", "aten::linspace.Tensor_Scalar", "aten::linspace.Tensor_Tensor",
     "aten::linspace.Scalar_Tensor")
def linspace(start, end, steps, **kwargs):
    dt = out_dtype()
    return _linspace_values(start, end, steps, dt).astype(dt)


@xla("aten::logspace", "aten::logspace.Tensor_Scalar", "aten::logspace.Tensor_Tensor",
     "aten::logspace.Scalar_Tensor")
def logspace(start, end, steps, base=10.0, **kwargs):
    dt = out_dtype()
    if jnp.issubdtype(dt, jnp.integer):
        # torch (CPU kernel and reference alike) truncates the end points to the integer
        # dtype before spacing the exponents: logspace(2.5, 0, 2, base=2) is [4, 1]
        start, end = jnp.asarray(start).astype(dt), jnp.asarray(end).astype(dt)
    exps = _linspace_values(start, end, steps, jnp.float64)
    return jnp.power(jnp.asarray(base).astype(jnp.float64), exps).astype(dt)


def _tri_indices(fn):
    def lower(row, col, offset=0, **kwargs):
        rows, cols = fn(row, offset, col)   # static sizes: computed while tracing
        return jnp.asarray(np.stack([rows, cols]), out_dtype()).reshape(out_shape())
    return lower


xla("aten::tril_indices", name="tril_indices")(_tri_indices(np.tril_indices))
xla("aten::triu_indices", name="triu_indices")(_tri_indices(np.triu_indices))
