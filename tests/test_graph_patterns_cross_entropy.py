"""``torch.compile(backend="tpu")`` rewrites a linear layer followed by cross entropy
(``F.linear`` or ``h @ W.T``, the ``.view(-1, V)`` reshape, Hugging Face's shifted
``logits[..., :-1, :]``, ignore_index) to ``tpu_kernels::linear_cross_entropy``; results
and gradients match CPU and the same graph without the pass. A bias, class weights, a
dtype-changing cast, or logits used elsewhere leave the graph as written."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import tpu_kernels  # noqa: F401
from graph_pattern_cases import check

LCE = "tpu_kernels.linear_cross_entropy.default"
B, S, HID, V = 2, 6, 32, 40


def _args(dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, V, (B, S), generator=g)
    labels[0, :2] = -100                  # ignored positions (padding)
    return [torch.randn(B, S, HID, generator=g, dtype=dtype), torch.randn(V, HID, generator=g, dtype=dtype), labels]


def _linear_view(h, w, labels):
    return F.cross_entropy(F.linear(h, w).view(-1, V), labels.view(-1))


def _shifted_sum(h, w, labels):           # Hugging Face's ForCausalLMLoss, summed
    logits = h @ w.T
    shift = logits[..., :-1, :].contiguous()
    return F.cross_entropy(shift.view(-1, V), labels[..., 1:].contiguous().view(-1), ignore_index=-100,
                           reduction="sum") / 7


def _flatten_t(h, w, labels):
    return F.cross_entropy(torch.matmul(h, w.t()).flatten(0, 1).float(), labels.flatten(), label_smoothing=0.1)


def test_linear_then_cross_entropy_becomes_the_fused_op():
    for fn in (_linear_view, _shifted_sum, _flatten_t):
        done, ops = check(fn, _args())
        assert done == {"linear_cross_entropy": 1}, (fn.__name__, done)
        assert LCE in ops and "tpu_kernels.cross_entropy.default" not in ops, (fn.__name__, sorted(ops))


def _bias(h, w, labels):
    return F.cross_entropy(F.linear(h, w, w[:, 0]).view(-1, V), labels.view(-1))


def _logits_kept(h, w, labels):
    logits = F.linear(h, w)
    return F.cross_entropy(logits.view(-1, V), labels.view(-1)) + logits.mean()


def _class_weights(h, w, labels):
    return F.cross_entropy(F.linear(h, w).view(-1, V), labels.view(-1), weight=w[:, 0].detach().abs())


def _rows_after_reshape(h, w, labels):    # a selection of the reshaped logits is not one of h's rows
    return F.cross_entropy(F.linear(h, w).view(-1, V)[1:], labels.view(-1)[1:])


def test_other_spellings_are_left_alone():
    for fn in (_bias, _logits_kept, _class_weights, _rows_after_reshape):
        done, _ = check(fn, _args(), off=False)
        assert "linear_cross_entropy" not in done, (fn.__name__, done)


def test_an_upcast_of_bf16_logits_is_left_alone():
    """The fused op's loss has the hidden states' dtype: a float32 loss of bf16 logits stays."""
    done, _ = check(lambda h, w, t: F.cross_entropy(F.linear(h, w).view(-1, V).float(), t.view(-1)),
                    _args(torch.bfloat16), off=False)
    assert "linear_cross_entropy" not in done, done
