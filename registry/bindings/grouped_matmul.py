"""Pallas grouped matmul (MoE experts) bound to ``tpu_kernels::ragged_dot`` and to
``aten._grouped_mm`` (what ``F.grouped_mm`` reaches) for its 2-D x 3-D case with offsets."""
from __future__ import annotations

from tpu_kernels import spmd_kernels
from tpu_kernels.registry.kernel_modules import kernel_module
from tpu_kernels.registry.decorator import tpu_kernel
from tpu_kernels.registry.dtypes import to_jax_dtype

gmm = kernel_module("tpu_kernels.pallas.grouped_matmul")


def _supports(lhs, rhs, groups):
    """The kernel's limits, with one group per rhs slice (the kernel's group offset, for
    a shard of the experts, is not part of these ops)."""
    if rhs.dim() == 3 and groups.dim() == 1 and rhs.shape[0] != groups.shape[0]:
        return f"{rhs.shape[0]} rhs groups but {groups.shape[0]} group sizes/offsets"
    return gmm.supports(lhs.shape, to_jax_dtype(lhs.dtype), rhs.shape, to_jax_dtype(rhs.dtype),
                        groups.shape, to_jax_dtype(groups.dtype))


@tpu_kernel("tpu_kernels::ragged_dot", kind="pallas", supports=_supports)
def ragged_dot(lhs, rhs, group_sizes):
    return gmm.ragged_dot(lhs, rhs, group_sizes)


def _grouped_mm_supports(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if offs is None or mat_a.dim() != 2 or mat_b.dim() != 3:
        return "only the 2-D x 3-D (tokens x experts) case with offsets"
    if bias is not None or (out_dtype is not None and out_dtype != mat_a.dtype):
        return "bias and out_dtype run on the XLA path"
    return _supports(mat_a, mat_b, offs)


@tpu_kernel("aten::_grouped_mm", kind="pallas", supports=_grouped_mm_supports)
def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    # offs are the groups' cumulative row ends; per shard of experts when mat_b is sharded
    return spmd_kernels.grouped_matmul(mat_a, mat_b, offs)
