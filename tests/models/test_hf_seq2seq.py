"""More encoder-decoder models (transformers, tiny, random weights) on tpu vs CPU; T5,
BART and Whisper are in test_hf_encoders.py."""
from __future__ import annotations

import transformers as tf

from model_harness import Case, suite_tests
from tiny import BART_LIKE, H, I, L, NH, V, build, seq2seq

CASES = [
    Case("mbart", build(tf.MBartForConditionalGeneration, tf.MBartConfig, **BART_LIKE), seq2seq),
    Case("pegasus", build(tf.PegasusForConditionalGeneration, tf.PegasusConfig, decoder_start_token_id=0,
                          **BART_LIKE), seq2seq),
    Case("marian", build(tf.MarianMTModel, tf.MarianConfig, decoder_start_token_id=0, pad_token_id=0,
                         **BART_LIKE), seq2seq),
    Case("mt5", build(tf.MT5ForConditionalGeneration, tf.MT5Config, vocab_size=V, d_model=H, d_kv=8, d_ff=I,
                      num_layers=L, num_heads=NH, dropout_rate=0.0, decoder_start_token_id=0,
                      relative_attention_num_buckets=8), seq2seq),
]


# training steps in CI (one encoder-decoder beside T5 and Whisper); every one with --thorough
TRAIN_IN_CI = {"mbart"}
COMPILED_IN_CI = {"mbart"}
test_forward, test_train_step, test_compiled_train_step = suite_tests(CASES, TRAIN_IN_CI, COMPILED_IN_CI)
