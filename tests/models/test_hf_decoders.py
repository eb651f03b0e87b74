"""transformers decoder-only language models, tiny and randomly initialised, on tpu vs CPU."""
from __future__ import annotations

from typing import Callable

import pytest
import torch
import transformers as tf

from model_harness import Case, check_forward, check_train_step

# Shared sizes: every model's ops then compile for the same few shapes.
V, H, I, NH, KV, L, B, S = 128, 32, 64, 4, 2, 1, 2, 8


def _ids() -> dict:
    ids = torch.randint(0, V, (B, S))
    return {"input_ids": ids, "labels": ids}


def _lm(model_cls, config_cls, experts: str | None = None, **kw) -> Callable:
    def build():
        cfg = config_cls(vocab_size=V, **kw)
        cfg._attn_implementation = kw.get("attn_implementation", "sdpa")
        if experts is not None:
            cfg._experts_implementation = experts
        return model_cls(cfg)
    return build

_llama_like = dict(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                   num_key_value_heads=KV, max_position_embeddings=64, attn_implementation="sdpa")

CASES = [
    Case("llama", _lm(tf.LlamaForCausalLM, tf.LlamaConfig, **_llama_like), _ids),
    Case("mistral", _lm(tf.MistralForCausalLM, tf.MistralConfig, sliding_window=4, **_llama_like), _ids),
    Case("qwen2", _lm(tf.Qwen2ForCausalLM, tf.Qwen2Config, **_llama_like), _ids),
    Case("qwen3", _lm(tf.Qwen3ForCausalLM, tf.Qwen3Config, head_dim=8, **_llama_like), _ids),
    Case("qwen3_moe", _lm(tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig, head_dim=8, num_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=I, decoder_sparse_step=1,
                          **_llama_like), _ids),  # experts through F.grouped_mm (aten::_grouped_mm)
    # the same MoE routing (topk, one_hot, index_add) with the per-expert loop
    Case("mixtral", _lm(tf.MixtralForCausalLM, tf.MixtralConfig, num_local_experts=4,
                        num_experts_per_tok=2, experts="eager", **_llama_like), _ids),
    Case("gemma", _lm(tf.GemmaForCausalLM, tf.GemmaConfig, head_dim=8, **_llama_like), _ids),
    Case("gemma3", _lm(tf.Gemma3ForCausalLM, tf.Gemma3TextConfig, head_dim=8, sliding_window=4,
                       **_llama_like), _ids),
    Case("gpt2", _lm(tf.GPT2LMHeadModel, tf.GPT2Config, n_embd=H, n_layer=L, n_head=NH, n_positions=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa"), _ids),
    Case("gpt_neox", _lm(tf.GPTNeoXForCausalLM, tf.GPTNeoXConfig, hidden_size=H, intermediate_size=I,
                         num_hidden_layers=L, num_attention_heads=NH, max_position_embeddings=64,
                         rotary_pct=0.5, attn_implementation="sdpa"), _ids),
    Case("phi", _lm(tf.PhiForCausalLM, tf.PhiConfig, hidden_size=H, intermediate_size=I,
                    num_hidden_layers=L, num_attention_heads=NH, max_position_embeddings=64,
                    partial_rotary_factor=0.5, attn_implementation="sdpa"), _ids),
    Case("falcon", _lm(tf.FalconForCausalLM, tf.FalconConfig, hidden_size=H, num_hidden_layers=L,
                       num_attention_heads=NH, attn_implementation="sdpa"), _ids),
    Case("bloom", _lm(tf.BloomForCausalLM, tf.BloomConfig, hidden_size=H, n_layer=L, n_head=NH,
                      hidden_dropout=0.0, attention_dropout=0.0, attn_implementation="eager"), _ids),
    Case("gpt_bigcode", _lm(tf.GPTBigCodeForCausalLM, tf.GPTBigCodeConfig, n_embd=H, n_layer=L, n_head=NH,
                            n_positions=64, multi_query=True, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, attn_implementation="sdpa"), _ids),
    Case("qwen2_moe", _lm(tf.Qwen2MoeForCausalLM, tf.Qwen2MoeConfig, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=I, shared_expert_intermediate_size=I,
                          decoder_sparse_step=1, experts="eager", **_llama_like), _ids),
    Case("opt", _lm(tf.OPTForCausalLM, tf.OPTConfig, hidden_size=H, ffn_dim=I, num_hidden_layers=L,
                    num_attention_heads=NH, word_embed_proj_dim=H, max_position_embeddings=64,
                    dropout=0.0, attention_dropout=0.0, attn_implementation="sdpa"), _ids),
]


# Slower: deeper and longer (2 layers, 64 tokens: new shapes to compile, and error that
# builds over layers). Run with `make test-thorough` or `pytest --thorough tests/models`.
def _long_ids() -> dict:
    ids = torch.randint(0, V, (B, 64))
    return {"input_ids": ids, "labels": ids}


_deep = dict(_llama_like, num_hidden_layers=2, max_position_embeddings=128)
CASES += [
    Case("llama_2l_64tok", _lm(tf.LlamaForCausalLM, tf.LlamaConfig, **_deep), _long_ids, thorough=True),
    Case("qwen3_moe_eager_2l_64tok", _lm(tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig, head_dim=8, num_experts=4,
                                         num_experts_per_tok=2, moe_intermediate_size=I,
                                         decoder_sparse_step=1, experts="eager", **_deep),
         _long_ids, thorough=True),
    Case("gpt2_2l_64tok", _lm(tf.GPT2LMHeadModel, tf.GPT2Config, n_embd=H, n_layer=2, n_head=NH, n_positions=128,
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa"),
         _long_ids, thorough=True),
]


@pytest.mark.parametrize("case", [c.params("forward") for c in CASES])
def test_forward(case):
    check_forward(case)


@pytest.mark.parametrize("case", [c.params("train") for c in CASES])
def test_train_step(case):
    check_train_step(case)
