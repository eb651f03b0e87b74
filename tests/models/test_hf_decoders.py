"""transformers decoder-only language models, tiny and randomly initialised, on tpu vs CPU."""
from __future__ import annotations

import transformers as tf

from model_harness import Case, suite_tests
from tiny import H, I, L, LLAMA_LIKE as _llama_like, NH, ids as _ids, lm as _lm, long_ids as _long_ids

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
    Case("phi3", _lm(tf.Phi3ForCausalLM, tf.Phi3Config, pad_token_id=0, **_llama_like), _ids),
    Case("starcoder2", _lm(tf.Starcoder2ForCausalLM, tf.Starcoder2Config, sliding_window=4, residual_dropout=0.0,
                           embedding_dropout=0.0, **_llama_like), _ids),
    Case("olmo2", _lm(tf.Olmo2ForCausalLM, tf.Olmo2Config, **_llama_like), _ids),
    Case("cohere", _lm(tf.CohereForCausalLM, tf.CohereConfig, use_qk_norm=True, **_llama_like), _ids),
    Case("stablelm", _lm(tf.StableLmForCausalLM, tf.StableLmConfig, qk_layernorm=True, use_parallel_residual=True,
                         hidden_dropout=0.0, **_llama_like), _ids),
    Case("granite", _lm(tf.GraniteForCausalLM, tf.GraniteConfig, embedding_multiplier=2.0, logits_scaling=4.0,
                        residual_multiplier=0.5, attention_multiplier=0.2, **_llama_like), _ids),
    # soft-capped attention logits take the eager attention path
    Case("gemma2", _lm(tf.Gemma2ForCausalLM, tf.Gemma2Config, head_dim=8, sliding_window=4, attn="eager",
                       attn_logit_softcapping=50.0, final_logit_softcapping=30.0, **_llama_like), _ids),
    Case("gptj", _lm(tf.GPTJForCausalLM, tf.GPTJConfig, n_embd=H, n_layer=L, n_head=NH, n_positions=64, rotary_dim=4,
                     n_inner=I, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn="eager"), _ids),
    Case("smollm3", _lm(tf.SmolLM3ForCausalLM, tf.SmolLM3Config, pad_token_id=0, **_llama_like), _ids),
    Case("mpt", _lm(tf.MptForCausalLM, tf.MptConfig, d_model=H, n_heads=NH, n_layers=L, expansion_ratio=2,
                    max_seq_len=64, attn="eager"), _ids),
]


# Slower: deeper and longer (2 layers, 64 tokens: new shapes to compile, and error that
# builds over layers). Run with `make test-thorough` or `pytest --thorough tests/models`.
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


# training steps in CI (rotary, learned positions, grouped_mm and looped experts, soft-capped eager attention, ALiBi, partial rotary); every one with --thorough
TRAIN_IN_CI = {"llama", "gpt2", "qwen3_moe", "mixtral", "gemma2", "bloom", "phi"}
COMPILED_IN_CI = {"bloom"}
test_forward, test_train_step, test_compiled_train_step = suite_tests(CASES, TRAIN_IN_CI, COMPILED_IN_CI)
