"""Hand-written torchvision-free CNNs (ResNet, MobileNet, UNet) and recurrent nets (LSTM, GRU)
on tpu vs CPU."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from model_harness import Case, suite_tests

B, C = 2, 3


class BasicBlock(nn.Module):
    """ResNet basic block: conv-BN-ReLU-conv-BN + (projected) identity."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


class ResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(C, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2))
        self.fc = nn.Linear(16, classes)

    def forward(self, pixel_values, labels=None):
        x = self.layers(self.stem(pixel_values))
        logits = self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))
        return logits if labels is None else (logits, F.cross_entropy(logits, labels))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise, 1x1 project (ReLU6), residual when it fits."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        mid = cin * expand
        self.block = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


class MobileNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(C, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.Hardswish())
        self.blocks = nn.Sequential(InvertedResidual(8, 8, 1), InvertedResidual(8, 16, 2))
        self.head = nn.Sequential(nn.Dropout(0.0), nn.Linear(16, classes))

    def forward(self, pixel_values, labels=None):
        x = self.blocks(self.stem(pixel_values)).mean((2, 3))
        logits = self.head(x)
        return logits if labels is None else (logits, F.cross_entropy(logits, labels, label_smoothing=0.1))


class UNet(nn.Module):
    """Two-level UNet: GroupNorm/SiLU conv blocks, max-pool down, conv-transpose and
    bilinear upsampling up, skip concatenations, per-pixel segmentation logits."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(2, cout), nn.SiLU(),
                                 nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(2, cout), nn.SiLU())
        self.down1, self.down2, self.mid = block(C, 8), block(8, 16), block(16, 16)
        self.up2 = nn.ConvTranspose2d(16, 16, 2, stride=2)
        self.dec2 = block(32, 8)
        self.dec1 = block(16, 8)
        self.out = nn.Conv2d(8, classes, 1)

    def forward(self, pixel_values, labels=None):
        d1 = self.down1(pixel_values)                       # 16x16
        d2 = self.down2(F.max_pool2d(d1, 2))                # 8x8
        m = self.mid(F.max_pool2d(d2, 2))                   # 4x4
        u2 = self.dec2(torch.cat([self.up2(m), d2], 1))     # 8x8 (transposed conv)
        u1 = F.interpolate(u2, scale_factor=2, mode="bilinear", align_corners=False)
        logits = self.out(self.dec1(torch.cat([u1, d1], 1)))
        return logits if labels is None else (logits, F.cross_entropy(logits, labels))


class RNNTagger(nn.Module):
    """Embedding -> 2-layer bidirectional LSTM/GRU (packed-free, batch_first) -> tag logits."""

    def __init__(self, cell: type, vocab: int = 128, dim: int = 16, hidden: int = 32, tags: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = cell(dim, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, tags)

    def forward(self, input_ids, labels=None):
        out, _ = self.rnn(self.embed(input_ids))
        logits = self.fc(out)
        if labels is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _images() -> dict:
    return {"pixel_values": torch.randn(B, C, 16, 16), "labels": torch.randint(0, 10, (B,))}


def _segmentation() -> dict:
    return {"pixel_values": torch.randn(B, C, 16, 16), "labels": torch.randint(0, 4, (B, 16, 16))}


def _tokens() -> dict:
    return {"input_ids": torch.randint(0, 128, (B, 8)), "labels": torch.randint(0, 8, (B, 8))}


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _loss(out, inputs):
    return out[1]


CASES = [
    Case("resnet", ResNet, _images, output=_first, loss=_loss),
    Case("mobilenet", MobileNet, _images, output=_first, loss=_loss),
    Case("unet", UNet, _segmentation, output=_first, loss=_loss),
    Case("lstm", lambda: RNNTagger(nn.LSTM), _tokens, output=_first, loss=_loss),
    Case("gru", lambda: RNNTagger(nn.GRU), _tokens, output=_first, loss=_loss),
]


# training steps in CI (the convolution/BatchNorm net and the recurrent one); every one with --thorough
TRAIN_IN_CI = {"resnet", "lstm"}
COMPILED_IN_CI = {"lstm"}
test_forward, test_train_step, test_compiled_train_step = suite_tests(CASES, TRAIN_IN_CI, COMPILED_IN_CI)
