"""Pallas flash attention bound to the fused attention op that ``F.scaled_dot_product_attention``
reaches on tpu (``_scaled_dot_product_flash_attention_for_cpu`` and its backward: see
``tpu_kernels/runtime_ops/fused_composites.py``; bool masks arrive as bool and travel to
the kernel as int8), and to ``tpu_kernels::flash_attention`` (and its backward), the op
for what SDPA cannot pass: segment ids of packed sequences and sliding windows."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_kernels import spmd_kernels
from tpu_kernels.registry.kernel_modules import kernel_module
from tpu_kernels.registry.decorator import tpu_kernel
from tpu_kernels.registry.dtypes import to_jax_dtype

kernel = kernel_module("tpu_kernels.pallas.flash_attention")


def _supports(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    m = attn_mask
    return spmd_kernels.attention_refusal(query.shape, key.shape,
                                          None if m is None else m.shape) or kernel.supports(query.shape, to_jax_dtype(query.dtype), key.shape, to_jax_dtype(key.dtype), value.shape, to_jax_dtype(value.dtype),
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


# -- tpu_kernels::flash_attention: segment ids and sliding windows (SDPA cannot pass them) ---

def _seg_shapes(q_segment_ids, kv_segment_ids):
    if q_segment_ids is None and kv_segment_ids is None:
        return None
    if q_segment_ids is None or kv_segment_ids is None:
        return ((), ())                   # refused: both or neither
    return (tuple(q_segment_ids.shape), tuple(kv_segment_ids.shape))


def _ids_supports(q_segment_ids, kv_segment_ids):
    for ids in (q_segment_ids, kv_segment_ids):
        if ids is not None and (ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool):
            return f"segment ids must be integers, not {ids.dtype}"
    return None


def _custom_supports(q, k, v, q_segment_ids=None, kv_segment_ids=None, is_causal=False,
                     scale=None, window=None):
    return _ids_supports(q_segment_ids, kv_segment_ids) or kernel.supports(
        q.shape, to_jax_dtype(q.dtype), k.shape, to_jax_dtype(k.dtype), v.shape,
        to_jax_dtype(v.dtype), causal=is_causal, scale=scale, window=window,
        segment_ids_shapes=_seg_shapes(q_segment_ids, kv_segment_ids))


def _attend(q, k, v, q_segment_ids, kv_segment_ids, is_causal, scale, window):
    return kernel.flash_attention(q, k, v, causal=is_causal, scale=scale, window=window,
                                  q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)


@tpu_kernel("tpu_kernels::flash_attention", kind="pallas", supports=_custom_supports,
            static=("is_causal", "scale", "window"))
def flash_attention(q, k, v, q_segment_ids=None, kv_segment_ids=None, is_causal=False,
                    scale=None, window=None):
    return _attend(q, k, v, q_segment_ids, kv_segment_ids, is_causal, scale, window)


def _custom_bwd_supports(grads, q, k, v, q_segment_ids=None, kv_segment_ids=None,
                         is_causal=False, scale=None, window=None):
    return _custom_supports(q, k, v, q_segment_ids, kv_segment_ids, is_causal, scale, window)


@tpu_kernel("tpu_kernels::flash_attention_backward", kind="pallas",
            supports=_custom_bwd_supports, static=("is_causal", "scale", "window"))
def flash_attention_backward(grads, q, k, v, q_segment_ids=None, kv_segment_ids=None,
                             is_causal=False, scale=None, window=None):
    # The op keeps no logsumexp between passes: the forward kernel runs again under the vjp.
    _, vjp = jax.vjp(lambda q, k, v: _attend(q, k, v, q_segment_ids, kv_segment_ids,
                                              is_causal, scale, window), q, k, v)
    dq, dk, dv = vjp(grads[0])
    # ids get zeros of their own shape (present) or an empty placeholder (absent)
    ids = [jnp.zeros((0,), jnp.float32) if x is None else jnp.zeros(x.shape, x.dtype)
           for x in (q_segment_ids, kv_segment_ids)]
    return [dq, dk, dv, *ids]
