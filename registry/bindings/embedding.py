"""Pallas embedding gather and its dense backward (scatter-add) bound to ATen."""
from __future__ import annotations

from tpu_kernels.registry.kernel_modules import kernel_module
from tpu_kernels.registry.decorator import tpu_kernel
from tpu_kernels.registry.dtypes import to_jax_dtype

kernel = kernel_module("tpu_kernels.pallas.embedding")


@tpu_kernel("aten::embedding", kind="pallas",
            supports=lambda weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False:
            "sparse gradients not supported" if sparse else
            kernel.supports(weight.shape, to_jax_dtype(weight.dtype), indices.shape, to_jax_dtype(indices.dtype)))
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return kernel.embedding(weight, indices)


@tpu_kernel("aten::embedding_dense_backward", kind="pallas",
            supports=lambda grad, indices, num_weights, padding_idx, scale_grad_by_freq:
            kernel.supports((num_weights, grad.shape[-1]), to_jax_dtype(grad.dtype), indices.shape, to_jax_dtype(indices.dtype)))
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    return kernel.embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq)
