"""transformers encoders, encoder-decoders, vision, audio and state-space models, tiny and
randomly initialised, on tpu vs CPU."""
from __future__ import annotations

import torch
import transformers as tf

from model_harness import Case, suite_tests
from tiny import (AUDIO_CONV, BART_LIKE, BERT_LIKE as _bert, B, H, I, L, NH, S, V, VIT_LIKE, audio as _audio,
                  build as _build, ids as _ids, image as _image, image_text as _clip, masked_ids as _masked_ids,
                  seq2seq as _seq2seq)


def _whisper() -> dict:
    # 16 mel bins x 16 frames: the conv stem halves it to max_source_positions=8
    return {"input_features": torch.randn(B, 16, 16), "labels": torch.randint(0, V, (B, 4))}


_t5 = dict(vocab_size=V, d_model=H, d_kv=8, d_ff=I, num_layers=L, num_heads=NH, dropout_rate=0.0,
           decoder_start_token_id=0, relative_attention_num_buckets=8)
_vit = dict(num_labels=4, **VIT_LIKE)


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
    Case("bart", _build(tf.BartForConditionalGeneration, tf.BartConfig, **BART_LIKE), _seq2seq),
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
                            feat_extract_norm="group", **AUDIO_CONV), _audio,
         drifts_train="on an AMD EPYC machine the gradient of lm_head.bias (a float32 sum over the CTC "
                      "logits' gradient) is 1.9e-5 off the float64 step where CPU torch is 1.6e-6 off, "
                      "beyond the harness's bound; every one of the step's 246 ATen ops matches CPU when "
                      "replayed alone (rounding, not a wrong op), and the step passed on the machines "
                      "CI used before"),
    Case("mamba", _build(tf.MambaForCausalLM, tf.MambaConfig, attn=None, vocab_size=V, hidden_size=H,
                         state_size=8, num_hidden_layers=L, expand=2, conv_kernel=4,
                         time_step_rank=4), _ids),
    Case("albert", _build(tf.AlbertForMaskedLM, tf.AlbertConfig, embedding_size=16, **_bert), _masked_ids),
    Case("electra", _build(tf.ElectraForMaskedLM, tf.ElectraConfig, embedding_size=16, **_bert), _masked_ids),
    Case("mpnet", _build(tf.MPNetForMaskedLM, tf.MPNetConfig, attn=None, **_bert), _masked_ids),
    Case("modernbert", _build(tf.ModernBertForMaskedLM, tf.ModernBertConfig, local_attention=4, pad_token_id=0,
                              global_attn_every_n_layers=1, attention_dropout=0.0, embedding_dropout=0.0,
                              mlp_dropout=0.0, **{k: v for k, v in _bert.items() if "prob" not in k}),
         _masked_ids),
    Case("convbert", _build(tf.ConvBertForMaskedLM, tf.ConvBertConfig, attn=None, embedding_size=16, head_ratio=2,
                            conv_kernel_size=3, **_bert), _masked_ids),
]


# training steps in CI (absolute, relative-bucket and disentangled attention, encoder-decoder, audio and image encoders); every one with --thorough
TRAIN_IN_CI = {"bert", "t5", "whisper", "vit", "clip", "deberta_v2"}
COMPILED_IN_CI = {"whisper"}
test_forward, test_train_step, test_compiled_train_step = suite_tests(CASES, TRAIN_IN_CI, COMPILED_IN_CI)
