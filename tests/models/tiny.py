"""Shared tiny sizes, model builders and inputs for the transformers model tests.

Every model uses the same few sizes (hidden 32, 4 heads, vocab 128, batch 2, 8 tokens,
16x16 images), so the ops they share compile once per test worker.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

V, H, I, NH, KV, L, B, S = 128, 32, 64, 4, 2, 1, 2, 8
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
LLAMA_LIKE = dict(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                  num_key_value_heads=KV, max_position_embeddings=64)
BERT_LIKE = dict(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
                 num_attention_heads=NH, max_position_embeddings=64, **NO_DROPOUT)
VIT_LIKE = dict(image_size=16, patch_size=4, num_channels=3, hidden_size=H, intermediate_size=I,
                num_hidden_layers=L, num_attention_heads=NH, **NO_DROPOUT)
BART_LIKE = dict(vocab_size=V, d_model=H, encoder_layers=L, decoder_layers=L, encoder_attention_heads=NH,
                 decoder_attention_heads=NH, encoder_ffn_dim=I, decoder_ffn_dim=I, max_position_embeddings=64,
                 dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
# wav2vec2-style feature extractors: 400 samples -> (400-8)/4+1 = 99 -> (99-4)/2+1 = 48 frames
AUDIO_CONV = dict(conv_dim=(16, 16), conv_stride=(4, 2), conv_kernel=(8, 4), num_conv_pos_embeddings=8,
                  num_conv_pos_embedding_groups=4, hidden_dropout=0.0, attention_dropout=0.0,
                  activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
                  mask_time_prob=0.0, mask_feature_prob=0.0, ctc_loss_reduction="mean", pad_token_id=0)


def build(model_cls, config_cls, attn: str | None = "sdpa", experts: str | None = None,
          post: Callable | None = None, **kw) -> Callable[[], torch.nn.Module]:
    """A builder of ``model_cls(config_cls(**kw))`` with the attention (and MoE experts)
    implementation set; ``post(model)`` adjusts the model after construction."""
    attn = kw.get("attn_implementation", attn)

    def make():
        cfg = config_cls(**kw)
        if attn is not None:
            cfg._attn_implementation = attn
        if experts is not None:
            cfg._experts_implementation = experts
        model = model_cls(cfg)
        return post(model) or model if post is not None else model
    return make


def lm(model_cls, config_cls, experts: str | None = None, attn: str = "sdpa", **kw) -> Callable:
    """A causal language model with the shared vocabulary."""
    return build(model_cls, config_cls, attn=attn, experts=experts, vocab_size=V, **kw)


def ids() -> dict:
    t = torch.randint(0, V, (B, S))
    return {"input_ids": t, "labels": t}


def long_ids() -> dict:
    t = torch.randint(0, V, (B, 64))
    return {"input_ids": t, "labels": t}


def masked_ids() -> dict:
    t = torch.randint(0, V, (B, S))
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, -3:] = 0                                      # a padded row
    labels = torch.where(torch.rand(B, S) < 0.5, t, torch.full_like(t, -100))
    return {"input_ids": t, "attention_mask": mask, "labels": labels}


def seq2seq() -> dict:
    t = torch.randint(0, V, (B, S))
    mask = torch.ones(B, S, dtype=torch.long)
    mask[0, -2:] = 0
    return {"input_ids": t, "attention_mask": mask, "labels": torch.randint(0, V, (B, S // 2))}


def image(classes: int = 4) -> dict:
    return {"pixel_values": torch.randn(B, 3, 16, 16), "labels": torch.randint(0, classes, (B,))}


def pixels() -> dict:
    return {"pixel_values": torch.randn(B, 3, 16, 16)}


def audio() -> dict:
    # CTC targets of length 5 over a 16-symbol vocabulary
    return {"input_values": torch.randn(B, 400), "labels": torch.randint(1, 16, (B, 5))}


def image_text() -> dict:
    return {"input_ids": torch.randint(0, V, (B, S)), "pixel_values": torch.randn(B, 3, 16, 16),
            "return_loss": True}
