"""``torch.compile(backend="tpu")`` rewrites softmax-then-matmul attention to
``F.scaled_dot_product_attention`` (the fused flash attention op each way): scaled
scores, an additive mask, a causal ``masked_fill`` (``triu`` or ``~tril`` of ones), a
boolean mask, float32 softmax cast back, dropout off. Results and gradients match CPU and
the same graph without the pass; other spellings are left as written."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import tpu_kernels  # noqa: F401
from graph_pattern_cases import check

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"
B, H, S, D = 1, 2, 8, 16


def _qkv(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, S, D, generator=g) for _ in range(3)]


def _hf_eager(q, k, v, mask):           # Llama's eager_attention_forward
    w = torch.matmul(q, k.transpose(2, 3)) * D ** -0.5
    w = w + mask
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    w = F.dropout(w, p=0.0, training=True)
    return torch.matmul(w, v)


def _causal_triu(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(D)
    s = s.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool, device=q.device), diagonal=1), float("-inf"))
    return s.softmax(-1) @ v


def _causal_tril(q, k, v):
    s = (q @ k.transpose(-1, -2)) * 0.3
    s = s.masked_fill(~torch.tril(torch.ones(S, S, dtype=torch.bool, device=q.device)), torch.finfo(q.dtype).min)
    return torch.softmax(s, dim=-1) @ v


def _bool_mask(q, k, v, keep):
    s = q @ k.transpose(-2, -1)
    return F.softmax(s.masked_fill(keep.logical_not(), float("-inf")), -1) @ v


def _mask(rows: int) -> torch.Tensor:
    keep = torch.rand(rows, 1, S, S, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[..., 0] = True                  # no row fully masked
    return keep


def test_hand_written_attention_becomes_flash_attention():
    add = torch.zeros(B, 1, S, S).masked_fill(~_mask(B), torch.finfo(torch.float32).min)
    for fn, extra in ((_hf_eager, [add]), (_causal_triu, []), (_causal_tril, []), (_bool_mask, [_mask(1)])):
        done, ops = check(fn, _qkv() + extra, grads=3)
        assert done == {"attention": 1}, (fn.__name__, done)
        assert FLASH in ops and "aten._softmax.default" not in ops, (fn.__name__, sorted(ops))


def _over_heads(q, k, v):                # softmax over the query dim: not attention
    return F.softmax(q @ k.transpose(-2, -1), dim=-2) @ v


def _mask_widens(q, k, v, m):            # the mask broadcasts the scores up
    return F.softmax(q @ k.transpose(-2, -1) + m, -1) @ v


def _fill_not_lowest(q, k, v):           # -1e4 is not the additive -inf of a fused mask
    s = q @ k.transpose(-2, -1)
    return s.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool, device=q.device), 1), -1e4).softmax(-1) @ v


def _scores_used_twice(q, k, v):
    p = F.softmax(q @ k.transpose(-2, -1), -1)
    return p @ v + p.sum(-1, keepdim=True)


def _dropout_on(q, k, v):                # p > 0 in training: dropout is not the flash op's
    return F.dropout(F.softmax(q @ k.transpose(-2, -1), -1), p=0.5, training=True) @ v * 0


def test_other_spellings_are_left_alone():
    wide = torch.randn(2, H, S, S, generator=torch.Generator().manual_seed(2))
    for fn, extra in ((_over_heads, []), (_mask_widens, [wide]), (_fill_not_lowest, []), (_scores_used_twice, []),
                      (_dropout_on, [])):
        done, _ = check(fn, _qkv() + extra, grads=3, off=False)
        assert "attention" not in done, (fn.__name__, done)


def _out_added_into(q, k, v):            # Nystromformer: context += conv(value)
    o = F.softmax(q @ k.transpose(-2, -1), -1) @ v
    o += v
    return o


def _out_view_scaled(q, k, v):
    o = F.softmax(q @ k.transpose(-2, -1), -1) @ v
    o.transpose(1, 2).mul_(2)
    return o


def _out_relu_in_place(q, k, v):
    return F.relu(F.softmax(q @ k.transpose(-2, -1), -1) @ v, inplace=True)


def _out_item_assigned(q, k, v):
    o = F.softmax(q @ k.transpose(-2, -1), -1) @ v
    o[:, 0] = 0
    return o


def test_attention_written_into_later_is_left_as_written():
    """Flash attention's derivative saves its output: an attention result that a later op
    writes into, itself or through a view, stays the matmuls it was (rewritten, autograd
    raised "modified by an inplace operation ... output 0 of
    ScaledDotProductFlashAttentionForCpu" while compiling; CPU runs the hand-written code)."""
    for fn in (_out_added_into, _out_view_scaled, _out_relu_in_place, _out_item_assigned):
        done, _ = check(fn, _qkv(), grads=3, off=False)
        assert "attention" not in done, (fn.__name__, done)
