"""Pallas tiled matmul bound to mm, addmm and bmm (``matmul`` and 2-D ``linear`` reach
these) and to ``tpu_kernels::linear`` / ``linear_weight_grad`` (an N-d ``linear`` and its
weight gradient: their leading dims flattened here, outside the kernel, where a reshape
costs nothing: a Pallas call is a fusion boundary already)."""
from __future__ import annotations

import math

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


def _rows(x):
    return (math.prod(x.shape[:-1]), x.shape[-1])


def _linear_supports(x, weight, bias=None):
    b = (None, None) if bias is None else (bias.shape, to_jax_dtype(bias.dtype))
    return kernel.supports(_rows(x), to_jax_dtype(x.dtype), weight.shape, to_jax_dtype(weight.dtype),
                           *b, transpose_b=True)


@tpu_kernel("tpu_kernels::linear", kind="pallas", supports=_linear_supports)
def linear(x, weight, bias=None):
    out = kernel.matmul(x.reshape(_rows(x)), weight, bias, transpose_b=True, precision=matmul_precision())
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _weight_grad_supports(grad, x):
    return kernel.supports(_rows(grad), to_jax_dtype(grad.dtype), _rows(x), to_jax_dtype(x.dtype),
                           transpose_a=True)


@tpu_kernel("tpu_kernels::linear_weight_grad", kind="pallas", supports=_weight_grad_supports)
def linear_weight_grad(grad, x):
    return kernel.matmul(grad.reshape(_rows(grad)), x.reshape(_rows(x)), transpose_a=True,
                         precision=matmul_precision())
