"""Small reference models used by the demo, the tests and the benchmarks.

``GPT``: a decoder-only transformer (token + position embedding, pre-LayerNorm blocks
with causal self-attention and a GELU MLP, tied LM head). ``CNN``: conv / batch norm /
pooling / linear. Both are plain ``torch.nn`` modules: nothing here knows about tpu.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tpu_kernels import deferred_mode


@dataclasses.dataclass
class GPTConfig:
    vocab: int = 256
    seq: int = 32
    dim: int = 64
    heads: int = 4
    layers: int = 2
    dropout: float = 0.0
    attention: str = "sdpa"   # "sdpa" (F.scaled_dot_product_attention) or "manual" (triu mask)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.cfg.heads
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        if self.cfg.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.cfg.dropout if self.training else 0.0)
        else:
            att = (q @ k.transpose(-2, -1)) * (d // h) ** -0.5
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
            att = torch.where(mask, torch.full_like(att, float("-inf")), att)
            y = self.drop(att.softmax(dim=-1)) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        return self.drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, 4 * cfg.dim), nn.GELU(),
                                 nn.Linear(4 * cfg.dim, cfg.dim), nn.Dropout(cfg.dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """``GPT(cfg)(tokens [b, t]) -> logits [b, t, vocab]``."""

    def __init__(self, cfg: GPTConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or GPTConfig()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.seq, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.fc = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        x = self.drop(self.tok(tokens) + self.pos(pos))
        for block in self.blocks:
            x = block(x)
        return self.fc(self.ln_f(x))

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token cross entropy."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


class CNN(nn.Module):
    """A small image classifier: ``CNN()(images [b, 3, h, w]) -> logits [b, classes]``."""

    def __init__(self, classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, groups=2), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AvgPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(2 * width, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).flatten(1))

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(images), labels)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple,
               loss_fn: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """One optimizer step on ``model.loss(*batch)`` (or ``loss_fn(*batch)``); returns the
    loss (not synchronised)."""
    opt.zero_grad()
    loss = (loss_fn or model.loss)(*batch)
    loss.backward()
    opt.step()
    return loss


def train(model: nn.Module, batch: tuple, steps: int, *, lr: float = 3e-3,
          foreach: bool | None = None, deferred: bool = False,
          compiled: bool = False) -> list[float]:
    """``steps`` AdamW steps on one batch; the losses. ``deferred`` runs each step recorded
    and fused (``tpu_kernels.deferred()``); ``compiled`` runs the loss and its backward
    through ``torch.compile(backend="tpu")``."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=foreach)
    loss_fn = torch.compile(model.loss, backend="tpu") if compiled else None
    losses = []
    for _ in range(steps):
        with deferred_mode.deferred() if deferred else contextlib.nullcontext():
            loss = train_step(model, opt, batch, loss_fn)
        losses.append(loss.item())
    return losses
