"""Pallas flash attention bound to the fused attention op that ``F.scaled_dot_product_attention``
reaches on tpu (``_scaled_dot_product_flash_attention_for_cpu`` and its backward: see
``tpu_kernels/patterns.py``)."""
from __future__ import annotations

from tpu_kernels import spmd_kernels
from tpu_kernels.registry.kernel_modules import kernel_module
from tpu_kernels.registry.decorator import tpu_kernel
from tpu_kernels.registry.dtypes import to_jax_dtype

kernel = kernel_module("tpu_kernels.pallas.flash_attention")


def _supports(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    m = attn_mask
    return kernel.supports(query.shape, to_jax_dtype(query.dtype), key.shape, to_jax_dtype(key.dtype), value.shape, to_jax_dtype(value.dtype),
                           None if m is None else m.shape, None if m is None else to_jax_dtype(m.dtype),
                           causal=is_causal, dropout_p=dropout_p)


@tpu_kernel("aten::_scaled_dot_product_flash_attention_for_cpu", kind="pallas", supports=_supports,
            static=("dropout_p", "scale"))
def sdpa_flash(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    # per shard of batch and heads when the operands are sharded (spmd_kernels)
    return spmd_kernels.flash_attention_fwd(query, key, value, attn_mask, causal=is_causal,
                                            scale=scale)


def _bwd_supports(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                  attn_mask=None, scale=None):
    return _supports(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)


@tpu_kernel("aten::_scaled_dot_product_flash_attention_for_cpu_backward", kind="pallas",
            supports=_bwd_supports, static=("dropout_p", "scale"))
def sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                        attn_mask=None, scale=None):
    return spmd_kernels.flash_attention_bwd(grad_out, query, key, value, out, logsumexp,
                                            attn_mask, causal=is_causal, scale=scale)
