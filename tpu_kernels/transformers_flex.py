"""Hugging Face transformers' ``attn_implementation="flex_attention"`` on tpu.

transformers switches flex attention off when torch's current accelerator is "tpu"
(torch_tpu has no FlexAttention), and elsewhere wraps ``flex_attention`` and
``create_block_mask`` in inductor compiles, which cannot take tpu tensors. ``enable()``
lifts the switch and, for tpu tensors only, calls both directly: flex_attention is still
one fused op each way (the Pallas kernel, or the dense XLA fallback). Models on other
devices keep transformers' own path.

    import transformers, tpu_kernels
    from tpu_kernels import transformers_flex
    transformers_flex.enable()
    config._attn_implementation = "flex_attention"
    model = transformers.LlamaForCausalLM(config).to("tpu")
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

import torch
import torch.nn.attention.flex_attention as flex_api

_MODULES = ("transformers.utils.import_utils", "transformers.utils", "transformers.modeling_utils",
            "transformers.masking_utils", "transformers.integrations.flex_attention")


def _available() -> bool:
    return True


def _on_tpu(*tensors: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in tensors)


def _block_mask_maker(hf_create: Callable) -> Callable:
    @functools.wraps(flex_api.create_block_mask)
    def create_block_mask(*args, device=None, _compile=False, **kwargs):
        if device is not None and torch.device(device).type == "tpu":
            return flex_api.create_block_mask(*args, device=device, **kwargs)
        return hf_create(*args, device=device, _compile=_compile, **kwargs)
    return create_block_mask


def _attention_caller(hf_call: Callable) -> Callable:
    @functools.wraps(hf_call)
    def compile_friendly_flex_attention(query, key, value, training=False, **kwargs):
        if _on_tpu(query):
            return flex_api.flex_attention(query, key, value, **kwargs)
        return hf_call(query, key, value, training=training, **kwargs)
    return compile_friendly_flex_attention


_enabled = False


def enable() -> None:
    """Idempotent: let transformers models on tpu use ``attn_implementation="flex_attention"``."""
    global _enabled
    if _enabled:
        return
    mods = [importlib.import_module(name) for name in _MODULES]
    for mod in mods:
        if hasattr(mod, "is_torch_flex_attn_available"):
            mod.is_torch_flex_attn_available = _available
    masking, hf_flex = mods[3], mods[4]
    for mod in (masking, hf_flex):       # names they import only when flex is available
        mod.BlockMask = flex_api.BlockMask
        hf_create = getattr(mod, "create_block_mask", flex_api.create_block_mask)
        mod.create_block_mask = _block_mask_maker(hf_create)
    hf_flex.flex_attention = flex_api.flex_attention
    hf_flex.flex_default_block_size = flex_api._DEFAULT_SPARSE_BLOCK_SIZE
    hf_flex.AuxRequest = getattr(flex_api, "AuxRequest", None)
    hf_flex.compile_friendly_flex_attention = _attention_caller(hf_flex.compile_friendly_flex_attention)
    _enabled = True
