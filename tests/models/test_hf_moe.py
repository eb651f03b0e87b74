"""Mixture-of-experts and multi-head latent attention language models (transformers, tiny,
random weights) on tpu vs CPU.

What they exercise beyond the dense decoders:

* routers whose scores tie: AFMoE initialises its gate to zero, so every expert scores the
  same and ``torch.topk`` picks among equal values; the tpu must pick what CPU torch picks
  (``registry/xla/_cpu_order.py``);
* grouped (device-limited) top-k routing with a correction bias and shared experts
  (DeepSeek-V3, GLM-4-MoE), ``topk(sorted=False)``;
* multi-head latent attention: query/key head size (nope + rope) differs from the value
  head size, so ``F.scaled_dot_product_attention`` gets a value head dim of its own.
"""
from __future__ import annotations

import transformers as tf

from model_harness import Case, suite_tests
from tiny import B, H, I, LLAMA_LIKE, NH, S, V, build, ids, lm, seq2seq

# MLA: q/k head size 8 + 4 = 12, value head size 16; every head has its own key and value
_MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=16,
            **dict(LLAMA_LIKE, num_key_value_heads=NH))
_ROUTED = dict(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=I)

CASES = [
    # zero-initialised gate: all router scores tie
    Case("afmoe", lm(tf.AfmoeForCausalLM, tf.AfmoeConfig, head_dim=8, num_experts=4, num_experts_per_tok=2,
                     num_shared_experts=1, moe_intermediate_size=I, num_dense_layers=0, **LLAMA_LIKE), ids),
    Case("deepseek_v2", lm(tf.DeepseekV2ForCausalLM, tf.DeepseekV2Config, q_lora_rank=None, n_group=2,
                           topk_group=1, topk_method="group_limited_greedy", first_k_dense_replace=0,
                           **_MLA, **_ROUTED), ids),
    Case("deepseek_v3", lm(tf.DeepseekV3ForCausalLM, tf.DeepseekV3Config, q_lora_rank=16, n_group=2,
                           topk_group=1, first_k_dense_replace=0, **_MLA, **_ROUTED), ids),
    Case("minicpm3", lm(tf.MiniCPM3ForCausalLM, tf.MiniCPM3Config, q_lora_rank=16, **_MLA), ids),
    Case("glm4_moe_lite", lm(tf.Glm4MoeLiteForCausalLM, tf.Glm4MoeLiteConfig, q_lora_rank=16, n_group=1,
                             topk_group=1, mlp_layer_types=["sparse"], **_MLA, **_ROUTED), ids),
    Case("glm4_moe", lm(tf.Glm4MoeForCausalLM, tf.Glm4MoeConfig, head_dim=8, n_group=2, topk_group=1,
                        first_k_dense_replace=0, **_ROUTED, **LLAMA_LIKE), ids),
    Case("olmoe", lm(tf.OlmoeForCausalLM, tf.OlmoeConfig, num_experts=4, num_experts_per_tok=2,
                     **LLAMA_LIKE), ids),
    Case("granitemoe", lm(tf.GraniteMoeForCausalLM, tf.GraniteMoeConfig, num_local_experts=4,
                          num_experts_per_tok=2, **LLAMA_LIKE), ids),
    Case("phimoe", lm(tf.PhimoeForCausalLM, tf.PhimoeConfig, num_local_experts=4, num_experts_per_tok=2,
                      **LLAMA_LIKE), ids),
    # encoder-decoder with a top-1 router per sparse layer
    Case("switch_transformers", build(tf.SwitchTransformersForConditionalGeneration, tf.SwitchTransformersConfig, attn=None,
                                      vocab_size=V, d_model=H, d_kv=8, d_ff=I, num_layers=2,
                                      num_decoder_layers=2, num_sparse_encoder_layers=1,
                                      num_sparse_decoder_layers=1, num_heads=NH, num_experts=4,
                                      expert_capacity=B * S, dropout_rate=0.0, router_jitter_noise=0.0,
                                      decoder_start_token_id=0, relative_attention_num_buckets=8),
         seq2seq),
]


# training steps in CI (latent attention with routed experts, and a plain top-k MoE); every one with --thorough
TRAIN_IN_CI = {"deepseek_v3", "olmoe"}
COMPILED_IN_CI = {"deepseek_v3"}
test_forward, test_train_step, test_compiled_train_step = suite_tests(CASES, TRAIN_IN_CI, COMPILED_IN_CI)
