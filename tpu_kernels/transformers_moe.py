"""Hugging Face transformers' MoE experts as one op: ``experts_implementation="tpu_kernels"``.

transformers runs a sparse MoE block's experts (Qwen3-MoE, Mixtral, ... : modules made with
``use_experts_implementation``) by the function its config's ``_experts_implementation``
names. ``enable()`` registers "tpu_kernels": the experts as one
``torch.ops.tpu_kernels.moe_experts`` call, the same value as transformers' "grouped_mm"
(every routed copy computed), and in a sharded program (``tpu_kernels.spmd``, the pod step
of ``tpu_kernels.aot.pod``) expert-parallel: tokens sent to the devices holding their
experts by all_to_all, with a capacity per expert (``tpu_kernels/spmd_moe.py``). Experts
this op does not cover (biases, transposed or interleaved weights, a post-expert norm, an
activation other than SiLU) keep transformers' "grouped_mm".

    from tpu_kernels import transformers_moe
    transformers_moe.use(model)          # enable() and switch every experts module
    model.config.moe_capacity_factor = 1.25   # optional: the sharded capacity (default 2.0)
"""
from __future__ import annotations

import torch
from torch import nn

from tpu_kernels import spmd_moe

NAME = "tpu_kernels"


def _covered(experts: nn.Module) -> bool:
    act = getattr(experts.config, "hidden_act", None)
    return (experts.has_gate and experts.is_concatenated and not experts.has_bias
            and not experts.is_transposed and not experts.has_post_expert_norm
            and act in ("silu", "swish"))


def experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts module's forward as ``tpu_kernels::moe_experts``."""
    if not _covered(self):
        from transformers.integrations.moe import grouped_mm_experts_forward
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    factor = getattr(self.config, "moe_capacity_factor", spmd_moe.DEFAULT_CAPACITY_FACTOR)
    w = self.gate_up_proj
    out = torch.ops.tpu_kernels.moe_experts(hidden_states.to(w.dtype), top_k_index,
                                            top_k_weights.to(w.dtype), w, self.down_proj,
                                            float(factor))
    return out.to(hidden_states.dtype)


def enable() -> None:
    """Register ``experts_implementation="tpu_kernels"`` with transformers."""
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(NAME, experts_forward)


def use(model: nn.Module) -> int:
    """``enable()`` and set every experts module's config to "tpu_kernels"; how many
    experts modules ``model`` has."""
    enable()
    n = 0
    for m in model.modules():
        if hasattr(m, "gate_up_proj") and hasattr(getattr(m, "config", None),
                                                  "_experts_implementation"):
            m.config._experts_implementation = NAME
            n += 1
    return n
