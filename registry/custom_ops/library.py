"""This library's own ops (``torch.ops.tpu_kernels.*``): their schemas (from the type
hints below), CPU references (plain torch, so the ops also run and are parity-checked on
CPU) and autograd. Their impls: ``registry/xla/library_ops.py`` (the XLA lowering every
kernel falls back to) and the Pallas/Helion bindings in ``registry/bindings/``.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from tpu_kernels import spmd_moe
from tpu_kernels.registry.custom_ops.define import declare_op, inputs_of


def _ce_reference(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    # torch's decomposition, not F.cross_entropy: on tpu tensors that call is caught whole
    # and comes back to this op (the reference differentiates its double backward)
    return torch.ops.aten.cross_entropy_loss.default.decompose(
        logits, target, weight, torch.nn._reduction.get_enum(reduction), ignore_index, label_smoothing)


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


def _linear_reference(x, weight, bias=None):
    # torch's decomposition, not F.linear: on tpu tensors that call is caught and comes back
    # to this op (the reference differentiates a double backward the same way)
    return torch.ops.aten.linear.default.decompose(x, weight, bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x [..., in], weight [out, in], bias [out])`` without flattening ``x`` to 2-D
    (one contraction over the last dim: a flatten's reshape between a matmul and its
    neighbours keeps XLA from fusing them on TPU)."""


def linear_weight_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``sum over the leading dims of grad [..., out] (x) x [..., in]`` -> ``[out, in]``: the
    weight's gradient of ``linear``."""


def _linear_backward(ctx, grad):
    x, weight, bias = (inputs_of(ctx) + (None,))[:3]
    need = ctx.needs_input_grad
    gx = LINEAR(grad, weight.t()) if need[0] else None
    gw = LINEAR_WEIGHT_GRAD(grad, x) if need[1] else None
    gb = grad.sum(tuple(range(grad.dim() - 1))) if len(need) > 2 and need[2] else None
    return gx, gw, gb


def _linear_weight_grad_backward(ctx, cot):
    grad, x = inputs_of(ctx)
    need = ctx.needs_input_grad
    return (LINEAR(x, cot) if need[0] else None), (LINEAR(grad, cot.t()) if need[1] else None)


def _moe_grads(g, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, capacity_factor=2.0):
    dx, dw, d1, d2 = spmd_moe.moe_experts_backward(g, hidden, top_k_index, top_k_weights,
                                                  gate_up_proj, down_proj, capacity_factor)
    return dx, None, dw, d1, d2


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


def _moe_reference(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, capacity_factor=2.0):
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for e in range(gate_up_proj.shape[0]):
        token, rank = torch.where(top_k_index == e)
        if token.numel():
            gate, up = (hidden[token] @ gate_up_proj[e].T).chunk(2, dim=-1)
            y = (F.silu(gate.float()) * up.float()).to(hidden.dtype) @ down_proj[e].T
            out.index_add_(0, token, y.float() * top_k_weights[token, rank, None].float())
    return out.to(hidden.dtype)


def moe_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                capacity_factor: float = 2.0) -> torch.Tensor:
    """A mixture-of-experts FFN's experts (Qwen3-MoE / Mixtral layout): for tokens
    ``hidden [T, H]`` routed to ``top_k_index [T, K]`` with ``top_k_weights [T, K]``,
    ``sum_k w[t, k] * down_proj[e] @ (silu(gate[e] @ x) * (up[e] @ x))`` with ``gate_up_proj
    [E, 2I, H]`` (gate rows first) and ``down_proj [E, H, I]``. Every routed copy is
    computed on one device; in a sharded program with the experts split over a mesh axis
    the copies are sent to their experts' devices (all_to_all), at most
    ``capacity_factor`` x the even share per expert (``tpu_kernels/spmd_moe.py``)."""


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


def _rpa_reference(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, scale=None):
    """Per sequence: its pages as one context, causal attention of its new tokens."""
    out = torch.zeros_like(q)
    _, hkv, ps, d = k_pages.shape
    rep = q.shape[1] // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    for s in range(min(int(num_seqs.reshape(-1)[0]), kv_lens.shape[0])):
        q0, q1, n = int(cu_q_lens[s]), int(cu_q_lens[s + 1]), int(kv_lens[s])
        if q1 <= q0:
            continue
        pages = page_table[s, :-(-n // ps)].long()
        k, v = (x[pages].transpose(0, 1).reshape(hkv, -1, d)[:, :n].repeat_interleave(rep, 0)
                .float() for x in (k_pages, v_pages))
        qs = q[q0:q1].transpose(0, 1).float()                       # [Hq, q_len, D]
        pos = torch.arange(n - (q1 - q0), n)[:, None]
        mask = torch.arange(n)[None, :] <= pos
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale)
        out[q0:q1] = o.transpose(0, 1).to(q.dtype)
    return out


def ragged_paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                           kv_lens: torch.Tensor, page_table: torch.Tensor, cu_q_lens: torch.Tensor,
                           num_seqs: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """Causal attention of each sequence's new tokens ``q [T, Hq, D]`` (sequence s owns rows
    ``cu_q_lens[s]:cu_q_lens[s+1]``) to its ``kv_lens[s]`` context tokens, kept in pages of
    ``k_pages, v_pages [N, Hkv, page_size, D]`` listed by ``page_table [S, P]`` (what a
    serving engine's step runs per layer); the first ``num_seqs [1]`` sequences are live."""


def _flash_reference(q, k, v, q_segment_ids=None, kv_segment_ids=None, is_causal=False,
                     scale=None, window=None):
    sq, skv = q.shape[-2], k.shape[-2]
    keep = torch.ones(sq, skv, dtype=torch.bool)
    if is_causal:
        keep = keep.tril()
    if window is not None:
        keep = keep & ~torch.ones(sq, skv, dtype=torch.bool).tril(-window)
    if q_segment_ids is not None:
        keep = keep & (q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale,
                                          enable_gqa=q.shape[-3] != k.shape[-3])


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    q_segment_ids: Optional[torch.Tensor] = None,
                    kv_segment_ids: Optional[torch.Tensor] = None, is_causal: bool = False,
                    scale: Optional[float] = None, window: Optional[int] = None) -> torch.Tensor:
    """Attention of ``q [b, hq, sq, d]`` to ``k, v [b, hkv, skv, d]`` (hq % hkv == 0) with
    the masks the kernel builds itself instead of reading a dense mask: ``is_causal``
    (top-left), a sliding ``window`` (with causal: keys at most window - 1 back) and
    segment ids ``q_segment_ids [b, sq]``, ``kv_segment_ids [b, skv]`` (packed sequences:
    a query attends only to keys with its id). What ``F.scaled_dot_product_attention``
    cannot pass; the flash kernel skips blocks these masks empty."""


CROSS_ENTROPY = declare_op("tpu_kernels::cross_entropy", cross_entropy, reference=_ce_reference, backward="vjp")
LINEAR_CROSS_ENTROPY = declare_op("tpu_kernels::linear_cross_entropy", linear_cross_entropy,
                                  reference=_lce_reference, backward="vjp")
LINEAR = declare_op("tpu_kernels::linear", linear, reference=_linear_reference,
                    torch_backward=_linear_backward)
LINEAR_WEIGHT_GRAD = declare_op(
    "tpu_kernels::linear_weight_grad", linear_weight_grad, torch_backward=_linear_weight_grad_backward,
    reference=lambda grad, x: torch.einsum("...o,...i->oi", grad, x))
RAGGED_DOT = declare_op("tpu_kernels::ragged_dot", ragged_dot, reference=_ragged_dot_reference, backward="vjp")
MOE_EXPERTS = declare_op("tpu_kernels::moe_experts", moe_experts, reference=_moe_reference,
                        backward=_moe_grads, backward_static=("capacity_factor",),
                        fake=lambda hidden, *args, **kw: torch.empty_like(hidden))
SWIGLU = declare_op("tpu_kernels::swiglu", swiglu, reference=lambda a, b: F.silu(a) * b, backward="vjp")
GEGLU = declare_op("tpu_kernels::geglu", geglu, backward="vjp",
                   reference=lambda a, b, approximate="none": F.gelu(a, approximate=approximate) * b)
ROPE = declare_op("tpu_kernels::rope", rope, reference=_rope_reference, backward="vjp")
FLASH_ATTENTION = declare_op("tpu_kernels::flash_attention", flash_attention,
                             reference=_flash_reference, backward="vjp")
RAGGED_PAGED_ATTENTION = declare_op("tpu_kernels::ragged_paged_attention", ragged_paged_attention,
                                    reference=_rpa_reference)
