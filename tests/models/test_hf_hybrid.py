"""State-space, recurrent and hybrid (attention + SSM/convolution) language models
(transformers, tiny, random weights, their pure-torch paths) on tpu vs CPU."""
from __future__ import annotations

import transformers as tf

from model_harness import Case, suite_tests
from tiny import H, I, KV, L, LLAMA_LIKE, NH, ids, lm

CASES = [
    Case("mamba2", lm(tf.Mamba2ForCausalLM, tf.Mamba2Config, attn=None, hidden_size=H, num_hidden_layers=L,
                      state_size=8, expand=2, num_heads=8, head_dim=8, n_groups=1, conv_kernel=4,
                      chunk_size=4, time_step_rank=4), ids),
    Case("falcon_mamba", lm(tf.FalconMambaForCausalLM, tf.FalconMambaConfig, attn=None, hidden_size=H,
                            num_hidden_layers=L, state_size=8, expand=2, conv_kernel=4, time_step_rank=4,
                            use_mambapy=False), ids),
    # one attention layer, one mamba layer with a 4-expert MoE MLP
    Case("jamba", lm(tf.JambaForCausalLM, tf.JambaConfig, hidden_size=H, intermediate_size=I,
                     num_hidden_layers=2, num_attention_heads=NH, num_key_value_heads=KV, num_experts=4,
                     num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2,
                     attn_layer_offset=0, use_mamba_kernels=False, mamba_d_state=8, mamba_d_conv=4,
                     mamba_expand=2, mamba_dt_rank=4, max_position_embeddings=64), ids),
    Case("bamba", lm(tf.BambaForCausalLM, tf.BambaConfig, hidden_size=H, intermediate_size=I,
                     num_hidden_layers=2, num_attention_heads=NH, num_key_value_heads=KV,
                     attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1,
                     mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=4,
                     max_position_embeddings=64), ids),
    Case("falcon_h1", lm(tf.FalconH1ForCausalLM, tf.FalconH1Config, hidden_size=H, intermediate_size=I,
                         num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=KV,
                         mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8,
                         mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=4, max_position_embeddings=64), ids),
    Case("recurrent_gemma", lm(tf.RecurrentGemmaForCausalLM, tf.RecurrentGemmaConfig, hidden_size=H,
                               intermediate_size=I, num_hidden_layers=2, num_attention_heads=NH,
                               num_key_value_heads=1, lru_width=H, attention_window_size=4, conv1d_width=4,
                               block_types=["recurrent", "attention"]), ids),
    Case("rwkv", lm(tf.RwkvForCausalLM, tf.RwkvConfig, attn=None, hidden_size=H, num_hidden_layers=2,
                    attention_hidden_size=H, intermediate_size=I, context_length=64), ids),
    Case("lfm2", lm(tf.Lfm2ForCausalLM, tf.Lfm2Config, layer_types=["conv", "full_attention"],
                    **dict(LLAMA_LIKE, num_hidden_layers=2)), ids),
]


# training steps in CI (the two selective-scan families); every one with --thorough
TRAIN_IN_CI = {"mamba2", "falcon_mamba"}
COMPILED_IN_CI = {"mamba2"}
test_forward, test_train_step, test_compiled_train_step = suite_tests(CASES, TRAIN_IN_CI, COMPILED_IN_CI)
