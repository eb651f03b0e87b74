"""Vision models (transformers, tiny, random weights; no timm, no torchvision) on tpu vs
CPU: ViT variants, convolutional networks, segmentation, DETR-style detection and SAM."""
from __future__ import annotations

import torch
import transformers as tf

from model_harness import Case, suite_tests
from tiny import B, H, I, L, NH, NO_DROPOUT, VIT_LIKE, build, image, pixels

_CNN = dict(num_labels=4)


def _segmentation() -> dict:
    return {"pixel_values": torch.randn(B, 3, 16, 16), "labels": torch.randint(0, 4, (B, 16, 16))}


def _image32() -> dict:
    return {"pixel_values": torch.randn(B, 3, 32, 32), "labels": torch.randint(0, 4, (B,))}


def _detection() -> dict:
    # DETR's Hungarian matcher (scipy, on CPU) pairs queries with these boxes
    labels = [{"class_labels": torch.randint(0, 4, (n,)), "boxes": torch.rand(n, 4) * 0.5 + 0.25}
              for n in (2, 1)]
    return {"pixel_values": torch.randn(B, 3, 32, 32), "labels": labels}


def _sam() -> dict:
    return {"pixel_values": torch.randn(B, 3, 32, 32), "input_points": torch.rand(B, 1, 1, 2) * 32}


def _detr():
    backbone = tf.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                               layer_type="basic", out_features=["stage2"])
    return tf.DetrConfig(backbone_config=backbone, num_queries=5, d_model=H, encoder_layers=L,
                         decoder_layers=L, encoder_attention_heads=NH, decoder_attention_heads=NH,
                         encoder_ffn_dim=I, decoder_ffn_dim=I, dropout=0.0, attention_dropout=0.0,
                         activation_dropout=0.0, num_labels=4)


def _sam_config():
    return tf.SamConfig(
        vision_config=dict(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                           image_size=32, patch_size=8, output_channels=16, window_size=2,
                           global_attn_indexes=[0], mlp_dim=I, num_pos_feats=8),
        prompt_encoder_config=dict(hidden_size=16, image_size=32, patch_size=8, mask_input_channels=4),
        mask_decoder_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, mlp_dim=32,
                                 iou_head_hidden_dim=16))


def _detr_outputs(o):
    return (o.logits, o.pred_boxes)


CASES = [
    Case("deit", build(tf.DeiTForImageClassification, tf.DeiTConfig, num_labels=4, **VIT_LIKE), image),
    # the relative position bias gathers its table with an index built on CPU
    Case("beit", build(tf.BeitForImageClassification, tf.BeitConfig, attn=None, use_relative_position_bias=True,
                       num_labels=4, **VIT_LIKE), image),
    Case("dinov2", build(tf.Dinov2ForImageClassification, tf.Dinov2Config, image_size=16, patch_size=4,
                         hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, mlp_ratio=2,
                         num_labels=4, **NO_DROPOUT), image),
    Case("convnextv2", build(tf.ConvNextV2ForImageClassification, tf.ConvNextV2Config, attn=None, patch_size=2,
                             num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], **_CNN), image),
    Case("resnet_hf", build(tf.ResNetForImageClassification, tf.ResNetConfig, attn=None, embedding_size=8,
                            hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", **_CNN), image),
    Case("regnet", build(tf.RegNetForImageClassification, tf.RegNetConfig, attn=None, embedding_size=8,
                         hidden_sizes=[8, 16], depths=[1, 1], groups_width=8, **_CNN), image),
    Case("mobilevit", build(tf.MobileViTForImageClassification, tf.MobileViTConfig, attn=None, image_size=32,
                            patch_size=2, hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 8, 8, 8, 16, 32],
                            num_attention_heads=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                            classifier_dropout_prob=0.0, **_CNN), _image32),
    Case("segformer", build(tf.SegformerForSemanticSegmentation, tf.SegformerConfig, attn=None,
                            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                            patch_sizes=[3, 3], strides=[2, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                            decoder_hidden_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                            classifier_dropout_prob=0.0, drop_path_rate=0.0, **_CNN), _segmentation),
    Case("swinv2", build(tf.Swinv2ForImageClassification, tf.Swinv2Config, attn=None, image_size=16, patch_size=2,
                         embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4, mlp_ratio=2.0,
                         drop_path_rate=0.0, **NO_DROPOUT, **_CNN), image),
    # the loss indexes the predictions with the Hungarian matcher's (scipy, CPU) indices
    Case("detr", lambda: tf.DetrForObjectDetection(_detr()), _detection, output=_detr_outputs),
    Case("yolos", build(tf.YolosForObjectDetection, tf.YolosConfig, num_detection_tokens=5, num_labels=4,
                        **dict(VIT_LIKE, image_size=[32, 32])), _detection, output=_detr_outputs),
    # the prompt encoder indexes point embeddings with indices built on CPU
    Case("sam", lambda: tf.SamModel(_sam_config()), _sam, output=lambda o: (o.iou_scores, o.pred_masks),
         loss=lambda o, inputs: o.pred_masks.pow(2).mean() + o.iou_scores.sum()),
    Case("vit_mae", build(tf.ViTMAEForPreTraining, tf.ViTMAEConfig, mask_ratio=0.0, decoder_hidden_size=H,
                          decoder_num_hidden_layers=L, decoder_num_attention_heads=NH, decoder_intermediate_size=I,
                          **VIT_LIKE), pixels),
]


# training steps in CI (a BatchNorm CNN and a ViT with layer scale); every one with --thorough
TRAIN_IN_CI = {"resnet_hf", "dinov2"}
COMPILED_IN_CI = {"resnet_hf"}
test_forward, test_train_step, test_compiled_train_step = suite_tests(CASES, TRAIN_IN_CI, COMPILED_IN_CI)
