"""Pallas tiled matmul bound to mm, addmm and bmm (``linear``/``matmul`` reach these)."""
from __future__ import annotations

from tpu_kernels.registry.kernel_modules import kernel_module
from tpu_kernels.registry.decorator import tpu_kernel
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.registry.xla._util import matmul_precision

kernel = kernel_module("tpu_kernels.pallas.matmul")


def _mm_supports(a, b):
    return kernel.supports(a.shape, to_jax_dtype(a.dtype), b.shape, to_jax_dtype(b.dtype))


@tpu_kernel("aten::mm", kind="pallas", supports=_mm_supports)
def mm(a, b):
    return kernel.matmul(a, b, precision=matmul_precision())


def _addmm_supports(bias, a, b, beta=1, alpha=1):
    return kernel.supports(a.shape, to_jax_dtype(a.dtype), b.shape, to_jax_dtype(b.dtype), bias.shape, to_jax_dtype(bias.dtype))


@tpu_kernel("aten::addmm", kind="pallas", supports=_addmm_supports, static=("beta", "alpha"))
def addmm(bias, a, b, beta=1, alpha=1):
    return kernel.matmul(a, b, bias, beta=beta, alpha=alpha, precision=matmul_precision())


@tpu_kernel("aten::bmm", kind="pallas", supports=_mm_supports)
def bmm(a, b):
    return kernel.bmm(a, b, precision=matmul_precision())
