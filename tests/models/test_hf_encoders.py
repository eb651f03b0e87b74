"""transformers encoders, encoder-decoders, vision, audio and state-space models, tiny and
randomly initialised, on tpu vs CPU."""
from __future__ import annotations

from typing import Callable

import pytest
import torch
import transformers as tf

from model_harness import Case, check_forward, check_train_step

V, H, I, NH, L, B, S = 128, 32, 64, 4, 1, 2, 8   # the decoders' sizes: shared compiled shapes
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _build(model_cls, config_cls, attn: str | None = "sdpa", **kw) -> Callable:
    def build():
        cfg = config_cls(**kw)
        if attn is not None:
            cfg._attn_implementation = attn
        return model_cls(cfg)
    return build


def _masked_ids() -> dict:
    ids = torch.randint(0, V, (B, S))
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, -3:] = 0                                      # a padded row
    labels = torch.where(torch.rand(B, S) < 0.5, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _seq2seq() -> dict:
    ids = torch.randint(0, V, (B, S))
    mask = torch.ones(B, S, dtype=torch.long)
    mask[0, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, V, (B, S // 2))}


def _image() -> dict:
    return {"pixel_values": torch.randn(B, 3, 16, 16), "labels": torch.randint(0, 4, (B,))}


def _whisper() -> dict:
    # 16 mel bins x 16 frames: the conv stem halves it to max_source_positions=8
    return {"input_features": torch.randn(B, 16, 16), "labels": torch.randint(0, V, (B, 4))}


def _audio() -> dict:
    # 400 samples -> (400-8)/4+1 = 99 -> (99-4)/2+1 = 48 frames; CTC targets of length 5
    return {"input_values": torch.randn(B, 400), "labels": torch.randint(1, 16, (B, 5))}


def _clip() -> dict:
    ids = torch.randint(0, V, (B, S))
    return {"input_ids": ids, "pixel_values": torch.randn(B, 3, 16, 16), "return_loss": True}


def _ids() -> dict:
    ids = torch.randint(0, V, (B, S))
    return {"input_ids": ids, "labels": ids}


_bert = dict(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
             num_attention_heads=NH, max_position_embeddings=64, **NO_DROPOUT)
_t5 = dict(vocab_size=V, d_model=H, d_kv=8, d_ff=I, num_layers=L, num_heads=NH, dropout_rate=0.0,
           decoder_start_token_id=0, relative_attention_num_buckets=8)
_vit = dict(image_size=16, patch_size=4, num_channels=3, hidden_size=H, intermediate_size=I,
            num_hidden_layers=L, num_attention_heads=NH, num_labels=4, **NO_DROPOUT)


def _clip_config():
    return tf.CLIPConfig(
        text_config=dict(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
                         num_attention_heads=NH, max_position_embeddings=S, projection_dim=H),
        vision_config=dict(image_size=16, patch_size=4, hidden_size=H, intermediate_size=I,
                           num_hidden_layers=L, num_attention_heads=NH, projection_dim=H),
        projection_dim=H)


CASES = [
    Case("bert", _build(tf.BertForMaskedLM, tf.BertConfig, **_bert), _masked_ids),
    Case("roberta", _build(tf.RobertaForMaskedLM, tf.RobertaConfig, pad_token_id=1, **_bert), _masked_ids),
    Case("distilbert", _build(tf.DistilBertForMaskedLM, tf.DistilBertConfig, vocab_size=V, dim=H,
                              hidden_dim=I, n_layers=L, n_heads=NH, max_position_embeddings=64,
                              dropout=0.0, attention_dropout=0.0), _masked_ids),
    # T5's learned relative-position bias is the sdpa attn_mask and needs its gradient
    Case("t5", _build(tf.T5ForConditionalGeneration, tf.T5Config, attn="sdpa", **_t5), _seq2seq),
    Case("t5_eager", _build(tf.T5ForConditionalGeneration, tf.T5Config, attn="eager", **_t5), _seq2seq),
    Case("bart", _build(tf.BartForConditionalGeneration, tf.BartConfig, vocab_size=V, d_model=H,
                        encoder_layers=L, decoder_layers=L, encoder_attention_heads=NH,
                        decoder_attention_heads=NH, encoder_ffn_dim=I, decoder_ffn_dim=I,
                        max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                        activation_dropout=0.0), _seq2seq),
    Case("whisper", _build(tf.WhisperForConditionalGeneration, tf.WhisperConfig, vocab_size=V,
                           num_mel_bins=16, d_model=H, encoder_layers=L, decoder_layers=L,
                           encoder_attention_heads=NH, decoder_attention_heads=NH,
                           encoder_ffn_dim=I, decoder_ffn_dim=I, max_source_positions=8,
                           max_target_positions=16, dropout=0.0, attention_dropout=0.0,
                           activation_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           decoder_start_token_id=1), _whisper),
    Case("vit", _build(tf.ViTForImageClassification, tf.ViTConfig, **_vit), _image),
    Case("clip", lambda: tf.CLIPModel(_clip_config()), _clip,
         output=lambda o: (o.logits_per_image, o.text_embeds, o.image_embeds)),
    Case("deberta_v2", _build(tf.DebertaV2ForMaskedLM, tf.DebertaV2Config, attn=None, relative_attention=True,
                              pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=16,
                              **_bert), _masked_ids),
    Case("swin", _build(tf.SwinForImageClassification, tf.SwinConfig, attn=None, image_size=16, patch_size=2,
                        embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4, mlp_ratio=2.0,
                        num_labels=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        drop_path_rate=0.0), _image),
    Case("convnext", _build(tf.ConvNextForImageClassification, tf.ConvNextConfig, attn=None, num_channels=3,
                            patch_size=2, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=4,
                            drop_path_rate=0.0, image_size=16), _image),
    Case("wav2vec2", _build(tf.Wav2Vec2ForCTC, tf.Wav2Vec2Config, vocab_size=16, hidden_size=H,
                            intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                            conv_dim=(16, 16), conv_stride=(4, 2), conv_kernel=(8, 4),
                            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4,
                            feat_extract_norm="group", hidden_dropout=0.0, attention_dropout=0.0,
                            activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
                            layerdrop=0.0, mask_time_prob=0.0, ctc_loss_reduction="mean",
                            pad_token_id=0), _audio,
         # the CTC loss gradient of each frame is exp(alpha + beta - loss) summed over the
         # label lattice after 48-frame log-space recursions, and lm_head's grad sums it over
         # 96 rows: float32 summation order differs (every op alone matches to the table,
         # checked op by op), leaving ~5e-6 relative on gradients of magnitude ~10
         train_tol=(1e-5, 1e-5)),
    Case("mamba", _build(tf.MambaForCausalLM, tf.MambaConfig, attn=None, vocab_size=V, hidden_size=H,
                         state_size=8, num_hidden_layers=L, expand=2, conv_kernel=4,
                         time_step_rank=4), _ids),
]


@pytest.mark.parametrize("case", [c.params("forward") for c in CASES])
def test_forward(case):
    check_forward(case)


@pytest.mark.parametrize("case", [c.params("train") for c in CASES])
def test_train_step(case):
    check_train_step(case)
