"""XLA impls of this library's ops (``torch.ops.tpu_kernels.*``, declared with their
schemas and CPU references in ``registry/custom_ops/library.py``): the lowering every
kernel bound to the same op (``registry/bindings``) falls back to.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import torch

from tpu_kernels import spmd_moe
from tpu_kernels.pallas.reference import cross_entropy as ce_ref
from tpu_kernels.pallas.reference import flash_attention as fa_ref
from tpu_kernels.pallas.reference import linear_cross_entropy as lce_ref
from tpu_kernels.registry.context import check
from tpu_kernels.registry.custom_ops import library  # noqa: F401  (declares the ops first)
from tpu_kernels.registry.decorator import tpu_kernel
from tpu_kernels.registry.dtypes import to_torch_dtype
from tpu_kernels.registry.xla.loss import check_label_smoothing, check_target_dtype, check_weight_dtype


def _targets_in_range(target, n_cls: int, ignore_index: int) -> None:
    target = ce_ref.class_indices(target)
    check((target == ignore_index) | ((target >= 0) & (target < n_cls)),
          f"Target is out of bounds (classes: {n_cls})")


def _check_ce_args(logits, target, weight, label_smoothing: float) -> None:
    """F.cross_entropy's static checks (the op's CPU reference makes them), made while the
    op's meta is traced, so every impl bound to the op gets them."""
    if isinstance(label_smoothing, (int, float)):   # a Python float in the meta, traced in the jit
        check_label_smoothing(label_smoothing)
    check_target_dtype(to_torch_dtype(target.dtype))
    check_weight_dtype(to_torch_dtype(logits.dtype), None if weight is None else to_torch_dtype(weight.dtype))


@tpu_kernel("tpu_kernels::cross_entropy", kind="xla")
def cross_entropy(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                  ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy(logits [n, C], target [n])`` in one fused XLA computation (f32 stats)."""
    _check_ce_args(logits, target, weight, label_smoothing)
    _targets_in_range(target, logits.shape[1], ignore_index)
    return ce_ref.cross_entropy(logits, target, weight, ignore_index=ignore_index,
                                reduction=reduction, label_smoothing=label_smoothing)


@tpu_kernel("tpu_kernels::linear_cross_entropy", kind="xla")
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         ignore_index: int = -100, reduction: str = "mean",
                         label_smoothing: float = 0.0) -> torch.Tensor:
    """``cross_entropy(hidden [n, h] @ weight [V, h].T, target)``; the Pallas kernel never
    materialises the logits, this XLA version does."""
    _targets_in_range(target, weight.shape[0], ignore_index)
    return lce_ref.linear_cross_entropy(hidden, weight, target, ignore_index=ignore_index,
                                        reduction=reduction, label_smoothing=label_smoothing)


@tpu_kernel("tpu_kernels::ragged_dot", kind="xla")
def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """Grouped matmul for MoE: rows of ``lhs [m, k]`` sorted by group, ``rhs [g, k, n]``,
    ``group_sizes [g]`` -> ``[m, n]`` (rows past the groups' total are zero)."""
    prec = jax.lax.Precision.HIGHEST if lhs.dtype == jnp.float32 else None
    return jax.lax.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32), precision=prec)


@tpu_kernel("tpu_kernels::moe_experts", kind="xla", static=("capacity_factor",))
def moe_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                capacity_factor: float = 2.0) -> torch.Tensor:
    """MoE experts: dropless grouped matmuls on one device, all_to_all expert parallelism
    where the experts are sharded (``tpu_kernels.spmd_moe``)."""
    return spmd_moe.moe_experts(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                                capacity_factor)


@tpu_kernel("tpu_kernels::flash_attention", kind="xla", static=("is_causal", "scale", "window"))
def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    q_segment_ids: Optional[torch.Tensor] = None,
                    kv_segment_ids: Optional[torch.Tensor] = None, is_causal: bool = False,
                    scale: Optional[float] = None, window: Optional[int] = None) -> torch.Tensor:
    """Attention with in-built causal / sliding-window / segment-id masks, scores in f32."""
    return fa_ref.attention(q, k, v, causal=is_causal, scale=scale, window=window,
                            q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)


# -- gated activations and rotary embedding ------------------------------------------------
def _f32(x):
    return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x


@tpu_kernel("tpu_kernels::swiglu", kind="xla")
def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` (the gate of Llama-family MLPs), computed in float32."""
    return (jax.nn.silu(_f32(a)) * _f32(b)).astype(a.dtype)


@tpu_kernel("tpu_kernels::geglu", kind="xla")
def geglu(a: torch.Tensor, b: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``gelu(a) * b`` (exact erf GELU, or ``approximate="tanh"``), computed in float32."""
    return (jax.nn.gelu(_f32(a), approximate=approximate == "tanh") * _f32(b)).astype(a.dtype)


def _rotate(x, cos, sin, interleaved: bool):
    if interleaved:   # pairs (x[2i], x[2i+1])
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rot = jnp.stack([-x2, x1], axis=-1).reshape(x.shape)
    else:             # halves, Llama/HF rotate_half
        h = x.shape[-1] // 2
        rot = jnp.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin


@tpu_kernel("tpu_kernels::rope", kind="xla")
def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of ``q``, ``k [b, h, s, d]`` with ``cos``, ``sin [s, d]``:
    the half-rotation layout (``interleaved=False``) or the interleaved pairs one."""
    c, s_ = _f32(cos), _f32(sin)
    return (_rotate(_f32(q), c, s_, interleaved).astype(q.dtype),
            _rotate(_f32(k), c, s_, interleaved).astype(k.dtype))
