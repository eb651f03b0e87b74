"""This library's own ops (``torch.ops.tpu_kernels.*``): their schemas (from the type
hints below), CPU references (plain torch, so the ops also run and are parity-checked on
CPU) and autograd. Their impls: ``registry/xla/library_ops.py`` (the XLA lowering every
kernel falls back to) and the Pallas/Helion bindings in ``registry/bindings/``.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from tpu_kernels.registry.custom_ops.define import declare_op


def _ce_reference(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return F.cross_entropy(logits, target, weight, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                  ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy(logits [n, C], target [n])`` in one fused computation (f32 stats)."""


def _lce_reference(hidden, weight, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return _ce_reference(hidden @ weight.T, target, None, ignore_index, reduction, label_smoothing)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         ignore_index: int = -100, reduction: str = "mean",
                         label_smoothing: float = 0.0) -> torch.Tensor:
    """``cross_entropy(hidden [n, h] @ weight [V, h].T, target)``; the Pallas kernel never
    materialises the logits, the XLA version does."""


def _ragged_dot_reference(lhs, rhs, group_sizes):
    out = lhs.new_zeros(lhs.shape[0], rhs.shape[-1])
    start = 0
    for g, n in enumerate(group_sizes.tolist()):
        out[start:start + n] = lhs[start:start + n] @ rhs[g]
        start += n
    return out


def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """Grouped matmul for MoE: rows of ``lhs [m, k]`` sorted by group, ``rhs [g, k, n]``,
    ``group_sizes [g]`` -> ``[m, n]`` (rows past the groups' total are zero)."""


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` (the gate of Llama-family MLPs), computed in float32."""


def geglu(a: torch.Tensor, b: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``gelu(a) * b`` (exact erf GELU, or ``approximate="tanh"``), computed in float32."""


def _rope_reference(q, k, cos, sin, interleaved=False):
    def rot(x):
        if interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack([-x2, x1], dim=-1).reshape(x.shape)
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of ``q``, ``k [b, h, s, d]`` with ``cos``, ``sin [s, d]``:
    the half-rotation layout (``interleaved=False``) or the interleaved pairs one."""


CROSS_ENTROPY = declare_op("tpu_kernels::cross_entropy", cross_entropy, reference=_ce_reference, backward="vjp")
LINEAR_CROSS_ENTROPY = declare_op("tpu_kernels::linear_cross_entropy", linear_cross_entropy,
                                  reference=_lce_reference, backward="vjp")
RAGGED_DOT = declare_op("tpu_kernels::ragged_dot", ragged_dot, reference=_ragged_dot_reference, backward="vjp")
SWIGLU = declare_op("tpu_kernels::swiglu", swiglu, reference=lambda a, b: F.silu(a) * b, backward="vjp")
GEGLU = declare_op("tpu_kernels::geglu", geglu, backward="vjp",
                   reference=lambda a, b, approximate="none": F.gelu(a, approximate=approximate) * b)
ROPE = declare_op("tpu_kernels::rope", rope, reference=_rope_reference, backward="vjp")
