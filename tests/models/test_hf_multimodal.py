"""Multimodal models (transformers, tiny, random weights) on tpu vs CPU: contrastive
image-text encoders, a fused vision-language transformer and a LLaVA-style model that
splices image features into a language model's token sequence."""
from __future__ import annotations

import torch
import transformers as tf

from model_harness import Case, suite_tests
from tiny import B, BERT_LIKE, H, I, L, LLAMA_LIKE, NH, S, V, build, image_text

_TEXT = dict(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
             max_position_embeddings=S)
_VISION = dict(image_size=16, patch_size=4, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
               num_attention_heads=NH)
IMAGE_TOKEN = V - 1
PATCHES = (16 // 4) ** 2


def _contrastive(o):
    return (o.logits_per_image, o.text_embeds, o.image_embeds)


def _vqa() -> dict:
    return {"input_ids": torch.randint(0, V, (B, S)), "pixel_values": torch.randn(B, 3, 16, 16),
            "labels": torch.rand(B, 4)}


def _llava_inputs() -> dict:
    text = torch.randint(0, V - 1, (B, 6))
    ids = torch.cat([torch.full((B, PATCHES), IMAGE_TOKEN), text], 1)
    return {"input_ids": ids, "pixel_values": torch.randn(B, 3, 16, 16), "labels": ids}


def _llava():
    cfg = tf.LlavaConfig(vision_config=tf.CLIPVisionConfig(**_VISION),
                         text_config=tf.LlamaConfig(vocab_size=V, **LLAMA_LIKE),
                         image_token_index=IMAGE_TOKEN, image_seq_length=PATCHES,
                         vision_feature_layer=-1, vision_feature_select_strategy="default")
    return tf.LlavaForConditionalGeneration(cfg)


CASES = [
    Case("siglip", lambda: tf.SiglipModel(tf.SiglipConfig(text_config=_TEXT, vision_config=_VISION)),
         image_text, output=_contrastive),
    Case("owlvit", lambda: tf.OwlViTModel(tf.OwlViTConfig(text_config=dict(_TEXT, max_position_embeddings=16),
                                                          vision_config=_VISION, projection_dim=H)),
         image_text, output=_contrastive),
    Case("blip", lambda: tf.BlipModel(tf.BlipConfig(text_config=dict(_TEXT, max_position_embeddings=16),
                                                    vision_config=_VISION, projection_dim=H)),
         image_text, output=_contrastive),
    # patch selection indexes the patch embeddings with indices built on CPU
    Case("vilt", build(tf.ViltForQuestionAnswering, tf.ViltConfig, attn=None, image_size=16, patch_size=4,
                       num_labels=4, max_image_length=-1, **BERT_LIKE), _vqa),
    Case("llava", _llava, _llava_inputs),
]


# training steps in CI (a vision tower feeding a decoder, and a two-tower sigmoid loss); every one with --thorough
TRAIN_IN_CI = {"llava", "siglip"}
COMPILED_IN_CI = {"llava"}
test_forward, test_train_step, test_compiled_train_step = suite_tests(CASES, TRAIN_IN_CI, COMPILED_IN_CI)
