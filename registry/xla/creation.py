"""Factories and fills: empty, zeros, ones, full, arange, *_like, fill_, zero_, clone."""
from __future__ import annotations

import jax.numpy as jnp

from tpu_kernels.registry.context import out_dtype, out_shape
from tpu_kernels.registry.decorator import xla

@xla("aten::empty.memory_format", "aten::empty_strided", "aten::zeros", "aten::empty_like",
     "aten::zeros_like", "aten::new_zeros", "aten::new_empty", "aten::new_empty_strided",
     "aten::empty_permuted")
def zeros(*args, **kwargs):
    # "empty" is zero-filled: deterministic, and free under XLA
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


@xla("aten::clone", "aten::_to_copy", "aten::alias_copy", "aten::lift_fresh_copy")
def clone(self, **kwargs):
    return self.astype(out_dtype())


@xla("aten::copy_", "aten::copy")
def copy(self, src, non_blocking=False):
    return jnp.broadcast_to(src.astype(self.dtype), self.shape)
