"""Comparison and logical lowerings: eq, ne, lt, le, gt, ge (in the operands' promoted
dtype, as torch compares), logical_and/or/xor, and the asynchronous asserts (_assert_async)."""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from tpu_kernels.registry.context import check
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import as_dtype, compute_dtype

_COMPARE = {"eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
            "gt": jnp.greater, "ge": jnp.greater_equal}


def compare_core(name: str) -> Callable:
    fn = _COMPARE[name]

    def core(x, other, dt=None):
        cd = compute_dtype(x, other)  # compare in the promoted type, as torch does
        return fn(as_dtype(x, cd), as_dtype(other, cd))
    return core


for _name in _COMPARE:
    xla(f"aten::{_name}.Tensor", f"aten::{_name}.Scalar", name=_name)(
        (lambda core: lambda x, other: core(x, other))(compare_core(_name)))


_LOGICAL = {"logical_and": jnp.logical_and, "logical_or": jnp.logical_or, "logical_xor": jnp.logical_xor}

for _name, _fn in _LOGICAL.items():
    xla(f"aten::{_name}", name=_name)(
        (lambda fn: lambda x, other: fn(x != 0, other != 0))(_fn))


# torch's asynchronous asserts (decompositions emit them: one_hot's class range under
# inference mode): a deferred device-side check, raised at the next sync as CUDA's are
@xla("aten::_assert_async", "aten::_assert_async.msg")
def assert_async(self, assert_msg="Expected Tensor with single nonzero value, but got zero"):
    check(self != 0, assert_msg, RuntimeError)
