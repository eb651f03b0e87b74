"""``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``'s inference fast path.

In eval mode without autograd, torch sends these modules' whole forward to one native op
(``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``) for CPU, CUDA and
the PrivateUse1 device alike. The native ops have no XLA form of their own here: each is
run as what it computes, the modules' slow path in torch functions (in-projection,
attention, out-projection; the layer's norms and feed-forward), whose ops the registry
runs (attention through ``scaled_dot_product_attention``'s fused op).

``nn.TransformerEncoder`` goes further in eval mode with a padding mask: it packs the
batch into a nested tensor (``_nested_tensor_from_mask``), runs its layers on it, and pads
the result with zeros (``to_padded_tensor``). The tpu device has no nested tensors, so
there the encoder runs the same layers on the padded batch with the padding mask (each
sequence attends to its own tokens, as nested) and zeroes the padded positions before its
final norm: the nested path's result. ``_nested_tensor_from_mask_left_aligned`` (the
check that picks the path) runs as torch's.

The merged mask: ``mask_type`` 0 is an attention mask [L, S], 1 a key padding mask [B, S],
2 both merged to [B, H, L, S] (``MultiheadAttention.merge_masks``); a bool mask marks the
positions not attended to, a float one is added, as in ``F.multi_head_attention_forward``.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from tpu_kernels.registry import runtime_handler
from tpu_kernels.registry.dtypes import scalar_type_name


class NestedTensorsUnsupported(NotImplementedError):
    """A nested tensor was asked for on the tpu device."""


@runtime_handler("aten::_native_multi_head_attention")
def native_multi_head_attention(op, args, kwargs):
    return _mha(*args, **kwargs)


def _mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
         mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    """[B, L, E] batch-first inputs -> (output [B, L, E], weights or None)."""
    batch, length = query.shape[0], query.shape[1]
    attn_mask = key_padding_mask = None
    if mask is not None and mask_type == 1:
        key_padding_mask = mask
    elif mask is not None and mask_type == 2:
        attn_mask = mask.reshape(batch * num_head, length, mask.shape[-1])
    elif mask is not None:
        attn_mask = mask
    out, weights = F.multi_head_attention_forward(
        query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), embed_dim, num_head,
        qkv_weight, qkv_bias, None, None, False, 0.0, proj_weight, proj_bias, training=False,
        key_padding_mask=key_padding_mask, need_weights=need_weights, attn_mask=attn_mask,
        average_attn_weights=average_attn_weights)
    return out.transpose(0, 1), weights


@runtime_handler("aten::_transformer_encoder_layer_fwd")
def transformer_encoder_layer_fwd(op, args, kwargs):
    return _encoder_layer(*args, **kwargs)


def _encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                   norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                   ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    def attend(x):
        return _mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
                    need_weights=False, mask_type=mask_type)[0]

    def feed_forward(x):
        h = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)

    def norm(x, w, b):
        return F.layer_norm(x, (embed_dim,), w, b, eps)
    if norm_first:
        x = src + attend(norm(src, norm_weight_1, norm_bias_1))
        return x + feed_forward(norm(x, norm_weight_2, norm_bias_2))
    x = norm(src + attend(src), norm_weight_1, norm_bias_1)
    return norm(x + feed_forward(x), norm_weight_2, norm_bias_2)


@runtime_handler("aten::_nested_tensor_from_mask_left_aligned")
def nested_tensor_from_mask_left_aligned(op, args, kwargs):
    """Whether every row of ``mask`` [N, L] is its True entries, then its False ones."""
    t, mask = (*args, *kwargs.values())[:2]
    if mask.dtype != torch.bool:
        raise RuntimeError(f"Expected mask to be of ScalarType Bool, but got {scalar_type_name(mask.dtype)} instead.")
    if mask.dim() != 2 or t.dim() != 3 or tuple(mask.shape) != tuple(t.shape[:2]):
        raise RuntimeError(f"Mask size should match input size (input {tuple(t.shape)}, "
                           f"mask {tuple(mask.shape)}; a 3-D input and a 2-D mask)")
    return not bool((mask[:, 1:] & ~mask[:, :-1]).any())


@runtime_handler("aten::_nested_tensor_from_mask")
def nested_tensor_from_mask(op, args, kwargs):
    t, mask = (*args, *kwargs.values())[:2]
    raise NestedTensorsUnsupported(
        f"{op}: nested tensors are not supported on the tpu device (input {tuple(t.shape)} "
        f"{t.dtype}, mask {tuple(mask.shape)}): keep the padded tensor and its mask")


def _padded_encoder(encoder: torch.nn.TransformerEncoder, src: torch.Tensor, padding: torch.Tensor,
                    is_causal: Any) -> torch.Tensor:
    """What the encoder's nested path computes, on the padded batch (see above)."""
    out = src
    for layer in encoder.layers:
        out = layer(out, src_mask=None, is_causal=bool(is_causal), src_key_padding_mask=padding)
    out = out.masked_fill(padding.to(torch.bool).unsqueeze(-1), 0)   # (batch first: the path's condition)
    return out if encoder.norm is None else encoder.norm(out)


def _encoder_forward_with_padding(forward: Any) -> Any:
    @functools.wraps(forward)
    def wrapper(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        try:
            return forward(self, src, mask, src_key_padding_mask, is_causal)
        except NestedTensorsUnsupported:
            if src_key_padding_mask is None:
                raise
            return _padded_encoder(self, src, src_key_padding_mask, is_causal)
    return wrapper


torch.nn.TransformerEncoder.forward = _encoder_forward_with_padding(torch.nn.TransformerEncoder.forward)
