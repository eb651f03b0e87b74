"""Models to compile for a chip (``python -m tpu_kernels aot --model MODULE:FACTORY``).

A factory returns a ``ModelSpec``: how to build the model (on the meta device: no weights
are ever made), the batch of token ids one training step takes, and the loss. The bundled
ones: the library's GPT, small Llama- and Qwen3-MoE-shaped transformers (CI), and a
Llama-3-8B-shaped one in bf16 (the thorough profile).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from tpu_kernels.models import GPT, GPTConfig


@dataclasses.dataclass
class ModelSpec:
    name: str
    build: Callable[[], nn.Module]          # called under torch.device("meta")
    batch: int
    seq: int                                # tokens per sequence the loss is taken over
    loss: Callable[[nn.Module, torch.Tensor], torch.Tensor]   # (model, tokens) -> scalar
    dtype: torch.dtype = torch.float32
    extra_tokens: int = 0                   # token ids per sequence beyond ``seq`` (shifts)
    # model FLOPs per token of a training step (forward + backward); None: 6 x the
    # parameters that multiply (everything but embedding tables), plus attention
    flops_per_token: Callable[[nn.Module], float] | None = None
    # the same model with n decoder layers (``--layers``: time a pod compile at small depth
    # and scale per-layer figures); None: the model has no such knob
    with_layers: Callable[[int], "ModelSpec"] | None = None

    def at_depth(self, layers: int) -> "ModelSpec":
        """This model with ``layers`` decoder layers (named ``NAME-Lk``)."""
        if self.with_layers is None:
            raise ValueError(f"{self.name} cannot be built at another depth (--layers)")
        spec = self.with_layers(layers)
        return dataclasses.replace(spec, name=f"{self.name}-L{layers}")


def _hf_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, labels=tokens).loss


def gpt() -> ModelSpec:
    """The library's GPT (``tpu_kernels.models.GPT``) at its default config."""
    cfg = GPTConfig()
    return ModelSpec("gpt", lambda: GPT(cfg), batch=8, seq=cfg.seq, extra_tokens=1,
                     loss=lambda m, t: m.loss(t))


def _llama(name: str, batch: int, seq: int, dtype: torch.dtype, **cfg) -> ModelSpec:
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(use_cache=False, **cfg)    # training: no KV cache

    def build():
        return LlamaForCausalLM(config).to(dtype)
    return ModelSpec(name, build, batch=batch, seq=seq, loss=_hf_loss, dtype=dtype,
                     with_layers=lambda n: _llama(name, batch, seq, dtype,
                                                  **{**cfg, "num_hidden_layers": n}))


def llama_small() -> ModelSpec:
    """A two-layer Llama-shaped model (GQA 4/2, head_dim 64, SwiGLU, RMSNorm, RoPE)."""
    return _llama("llama-small", 4, 128, torch.float32, vocab_size=1024, hidden_size=256,
                  intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, max_position_embeddings=256)


def llama3_8b() -> ModelSpec:
    """Llama-3-8B's shapes in bf16: hidden 4096, FFN 14336, 32 layers, GQA 32/8, vocab
    128256, one sequence of 4096 tokens."""
    return _llama("llama3-8b", 1, 4096, torch.bfloat16, vocab_size=128256, hidden_size=4096,
                  intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
                  rope_theta=500000.0)


def qwen3_moe_small() -> ModelSpec:
    """A two-layer Qwen3-MoE-shaped model in bf16: 8 experts, top-2, experts run as one
    grouped matmul (``torch._grouped_mm``, bf16 only: static shapes, one XLA program)."""
    return _qwen3_moe("qwen3-moe-small", 4, 128, vocab_size=1024, hidden_size=256,
                      intermediate_size=512, moe_intermediate_size=128, num_experts=8,
                      num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, max_position_embeddings=256)


def qwen3_moe_30b() -> ModelSpec:
    """Qwen3-30B-A3B's shapes in bf16: hidden 2048, 48 layers, 128 experts (FFN 768), top-8,
    GQA 32/4, vocab 151936, one sequence of 4096 tokens (the pod-scale report)."""
    return _qwen3_moe("qwen3-moe-30b", 1, 4096, vocab_size=151936, hidden_size=2048,
                      intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                      num_experts_per_tok=8, num_hidden_layers=48, num_attention_heads=32,
                      num_key_value_heads=4, head_dim=128, max_position_embeddings=8192,
                      rope_theta=1000000.0)


def _qwen3_moe(name: str, batch: int, seq: int, **cfg) -> ModelSpec:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    config = Qwen3MoeConfig(use_cache=False, **cfg)
    config._experts_implementation = "grouped_mm"

    def build():
        return Qwen3MoeForCausalLM(config).to(torch.bfloat16)

    def flops_per_token(model: nn.Module) -> float:
        experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
        dense = _multiplying_params(model) - experts
        return 6 * (dense + experts * config.num_experts_per_tok / config.num_experts)
    return ModelSpec(name, build, batch=batch, seq=seq, loss=_hf_loss,
                     dtype=torch.bfloat16, flops_per_token=flops_per_token,
                     with_layers=lambda n: _qwen3_moe(name, batch, seq,
                                                      **{**cfg, "num_hidden_layers": n}))


def _multiplying_params(model: nn.Module) -> int:
    """Parameters used in matmuls: all but embedding tables (a tied table counts once)."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    heads = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    return sum(p.numel() for p in model.parameters() if id(p) not in tables or id(p) in heads)


def _attention_flops_per_token(model: nn.Module, seq: int) -> float:
    """12 x layers x width x sequence (PaLM's count: QK^T and PV, forward + backward),
    for models whose config says their layers and width; else 0."""
    cfg = getattr(model, "config", None) or getattr(model, "cfg", None)
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "layers", None)
    heads = getattr(cfg, "num_attention_heads", None)
    width = heads * getattr(cfg, "head_dim", 0) if heads else getattr(cfg, "dim", None)
    return 12.0 * layers * width * seq if layers and width else 0.0


def model_flops_per_token(spec: ModelSpec, model: nn.Module) -> float:
    """Training FLOPs per token: the spec's own count, else 6 x multiplying parameters,
    plus attention."""
    dense = (spec.flops_per_token(model) if spec.flops_per_token is not None
             else 6.0 * _multiplying_params(model))
    return dense + _attention_flops_per_token(model, spec.seq)


BUNDLED: dict[str, Callable[[], ModelSpec]] = {
    "gpt": gpt, "llama-small": llama_small, "qwen3-moe-small": qwen3_moe_small,
    "llama3-8b": llama3_8b, "qwen3-moe-30b": qwen3_moe_30b,
}
