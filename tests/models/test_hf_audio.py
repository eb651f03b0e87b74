"""Speech and audio models (transformers, tiny, random weights) on tpu vs CPU: CTC
encoders over raw waveforms, and spectrogram encoders and encoder-decoders."""
from __future__ import annotations

import torch
import transformers as tf

from model_harness import Case, suite_tests
from tiny import AUDIO_CONV, B, H, I, L, NH, V, audio, build

_ENCODER = dict(vocab_size=16, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
                num_attention_heads=NH, **AUDIO_CONV)


def _features() -> dict:
    # 32 frames of 16 mel bins; the conv stem halves the frames twice
    return {"input_features": torch.randn(B, 32, 16), "labels": torch.randint(0, V, (B, 4))}


def _spectrogram() -> dict:
    return {"input_values": torch.randn(B, 16, 16), "labels": torch.randint(0, 4, (B,))}

# sew_d's training step: lm_head.bias's gradient is off the float64 step by 1.9e-5 where CPU's
# is off by 4.9e-8, although every ATen op matches CPU when replayed alone
SEW_D_GRAD = ("training step: grad of lm_head.bias differs from CPU (tpu off the float64 step by 1.9e-5, "
              "CPU by 4.9e-8) while every ATen op matches when replayed alone; not localised yet")

CASES = [
    Case("hubert", build(tf.HubertForCTC, tf.HubertConfig, feat_extract_norm="group", **_ENCODER), audio),
    Case("wavlm", build(tf.WavLMForCTC, tf.WavLMConfig, attn=None, feat_extract_norm="group", num_buckets=8,
                        max_bucket_distance=16, **_ENCODER), audio),
    Case("sew", build(tf.SEWForCTC, tf.SEWConfig, squeeze_factor=2, feat_extract_norm="group", **_ENCODER), audio),
    Case("sew_d", build(tf.SEWDForCTC, tf.SEWDConfig, attn=None, squeeze_factor=2, position_buckets=8,
                        max_position_embeddings=64, feat_extract_norm="group", **_ENCODER), audio,
         xfail_train=SEW_D_GRAD),
    Case("data2vec_audio", build(tf.Data2VecAudioForCTC, tf.Data2VecAudioConfig, **_ENCODER), audio),
    Case("speech_to_text", build(tf.Speech2TextForConditionalGeneration, tf.Speech2TextConfig, attn="eager",
                                 vocab_size=V, d_model=H,
                                 encoder_layers=L, decoder_layers=L, encoder_attention_heads=NH,
                                 decoder_attention_heads=NH, encoder_ffn_dim=I, decoder_ffn_dim=I,
                                 max_source_positions=64, max_target_positions=16, num_conv_layers=2,
                                 conv_kernel_sizes=[5, 5], conv_channels=16, input_feat_per_channel=16,
                                 input_channels=1, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                                 decoder_start_token_id=0), _features),
    Case("ast", build(tf.ASTForAudioClassification, tf.ASTConfig, hidden_size=H, num_hidden_layers=L,
                      num_attention_heads=NH, intermediate_size=I, patch_size=4, frequency_stride=4,
                      time_stride=4, max_length=16, num_mel_bins=16, num_labels=4,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), _spectrogram),
]


# training steps in CI (the convolutional feature extractor and CTC loss the others share); every one with --thorough
TRAIN_IN_CI = {"hubert"}
COMPILED_IN_CI = {"hubert"}
test_forward, test_train_step, test_compiled_train_step = suite_tests(CASES, TRAIN_IN_CI, COMPILED_IN_CI)
