"""``torch.compile(backend="tpu")`` rewrites hand-written LayerNorm (mean and biased
variance over the last dim, ``/ sqrt`` or ``* rsqrt``, with or without the float32
upcast, a ``[d]`` weight and bias joining the op) to ``aten.native_layer_norm``, and
interleaved rotary embeddings (GPT-J / Cohere ``stack((-x[..., 1::2], x[..., ::2]),
-1).flatten(-2)``) to ``tpu_kernels::rope(..., interleaved=True)``; results and gradients
match CPU and the same graph without the pass. Other spellings are left as written."""
from __future__ import annotations

import torch

import tpu_kernels  # noqa: F401
from graph_pattern_cases import check

EPS = 1e-5


def _ln_args() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 32, generator=g) * 3 + 1, torch.randn(32, generator=g), torch.randn(32, generator=g)]


def _ln_pow(x, w, b):                     # mean of squared deviations, / sqrt, weight and bias
    m = x.mean(-1, keepdim=True)
    return (x - m) / torch.sqrt(((x - m) ** 2).mean(-1, keepdim=True) + EPS) * w + b


def _ln_var_upcast(x, w, b):              # float32 upcast, var(unbiased=False), * rsqrt, cast, weight
    h = x.float()
    y = (h - h.mean(dim=-1, keepdim=True)) * torch.rsqrt(h.var(-1, keepdim=True, unbiased=False) + EPS)
    return w * y.to(x.dtype) + b


def _ln_correction(x, w, b):              # torch.var with correction=0, no affine
    c = x - torch.mean(x, -1, keepdim=True)
    return c / (torch.var(x, dim=-1, correction=0, keepdim=True) + EPS).sqrt() + w.sum()


def test_hand_written_layer_norm_becomes_native_layer_norm():
    for fn in (_ln_pow, _ln_var_upcast, _ln_correction):
        done, ops = check(fn, _ln_args())
        assert done == {"layer_norm": 1}, (fn.__name__, done)
        assert "aten.native_layer_norm.default" in ops and "aten.native_layer_norm_backward.default" in ops, ops
        assert not {"aten.sqrt.default", "aten.rsqrt.default", "aten.var.correction"} & ops, (fn.__name__, ops)


def _eps_outside(x, w, b):
    m = x.mean(-1, keepdim=True)
    return (x - m) / (torch.sqrt(((x - m) ** 2).mean(-1, keepdim=True)) + EPS) * w


def _unbiased(x, w, b):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + EPS)


def _over_rows(x, w, b):                  # ConvNeXt's channels-first norm: not the last dim
    m = x.mean(0, keepdim=True)
    return (x - m) / torch.sqrt(((x - m) ** 2).mean(0, keepdim=True) + EPS)


def _other_mean(x, w, b):                 # the deviation from another tensor's mean
    m = (x * 2).mean(-1, keepdim=True)
    return (x - m) / torch.sqrt(((x - m) ** 2).mean(-1, keepdim=True) + EPS)


def test_other_norm_spellings_are_left_alone():
    for fn in (_eps_outside, _unbiased, _over_rows, _other_mean):
        done, _ = check(fn, _ln_args(), off=False)
        assert "layer_norm" not in done, (fn.__name__, done)


def _rope_args() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=g) for s in ((1, 4, 6, 16), (1, 2, 6, 16), (6, 16), (6, 16))]


def _rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def _rope_interleaved(q, k, cos, sin):    # Cohere: q, k [b, h, s, d]; cos, sin [s, d] unsqueezed
    cos, sin = cos[None, None], sin.unsqueeze(0).unsqueeze(1)
    q2 = q * cos + _rotate_every_two(q) * sin
    k2 = (k * cos) + (_rotate_every_two(k) * sin)
    return q2.sum(1, keepdim=True) * k2.mean(1, keepdim=True)


def test_interleaved_rope_becomes_the_rope_kernel_op():
    done, ops = check(_rope_interleaved, _rope_args())
    assert done == {"rope": 1}, done
    assert "tpu_kernels.rope.default" in ops and "aten.stack.default" not in ops, ops


def _rope_bshd(q, k, cos, sin):           # GPT-J's [b, s, h, d] layout: left as written
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = cos[None, :, None], sin[None, :, None]
    return (q * cos + _rotate_every_two(q) * sin).sum(2) * (k * cos + _rotate_every_two(k) * sin).sum(2)


def _rope_wrong_pairs(q, k, cos, sin):    # x[..., ::2] twice is not a rotation
    def rot(x):
        return torch.stack((-x[..., ::2], x[..., ::2]), dim=-1).flatten(-2)
    cos, sin = cos[None, None], sin[None, None]
    return (q * cos + rot(q) * sin).sum(1) * (k * cos + rot(k) * sin).sum(1)


def test_other_rope_spellings_are_left_alone():
    for fn in (_rope_bshd, _rope_wrong_pairs):
        done, _ = check(fn, _rope_args(), off=False)
        assert "rope" not in done, (fn.__name__, done)
