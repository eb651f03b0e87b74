"""Parity of the loss lowerings (registry/xla/loss.py, ctc.py) with CPU torch."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same, check, to_tpu

from tpu_kernels import registry

aten = torch.ops.aten
REDUCTIONS = ["none", "mean", "sum"]
FLOATS = [torch.float32, torch.bfloat16]


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _unif(*shape, seed=6):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def check_vs_f32(fn, *args):
    """bf16 on tpu vs torch in f32 on the same values, rounded to bf16.

    Torch's CPU loss kernels accumulate bf16 reductions sequentially in bf16 (a sum of
    16 terms drifts by several ulps); the lowerings accumulate in f32 as on TPU.
    """
    up = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args]
    expected = fn(*up).to(torch.bfloat16)
    assert_same(expected, fn(*to_tpu(args)), getattr(fn, "__name__", "fn"))


def _targets(n, classes, ignore=-100, seed=1):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, classes, (n,), generator=g)
    t[::3] = ignore
    return t


# -- nll_loss --------------------------------------------------------------------------------
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_nll_loss_forward_backward_ops(reduction, weighted):
    x, t = _rand(7, 5), _targets(7, 5)
    w = _unif(5) + 0.5 if weighted else None
    out, total = check(lambda x, t, w: aten.nll_loss_forward(x, t, w, reduction, -100), x, t, w)
    g = _rand(*out.shape, seed=2)
    tw = total.cpu()
    check(lambda g, x, t, w, tw: aten.nll_loss_backward(g, x, t, w, reduction, -100, tw), g, x, t, w, tw)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss_grad(reduction):
    x = _rand(6, 11).requires_grad_()
    t, w = _targets(6, 11, ignore=2), _rand(11, seed=5).abs()
    check(lambda x, t, w: F.nll_loss(x, t, w, ignore_index=2, reduction=reduction), x, t, w, grad=True)
    check(lambda x, t: F.nll_loss(x, t, reduction=reduction), x, t, grad=True)


def test_nll_loss_bf16():
    x, t = _rand(16, 11, dtype=torch.bfloat16), _targets(16, 11, ignore=2)
    w = _rand(11, seed=5).abs().bfloat16()
    check(lambda x, t, w: F.nll_loss(x, t, w, ignore_index=2, reduction="none"), x, t, w)
    for r in ("mean", "sum"):
        check_vs_f32(lambda x, t, w: F.nll_loss(x, t, w, ignore_index=2, reduction=r), x, t, w)
        check_vs_f32(lambda x, t: F.nll_loss(x, t, reduction=r), x, t)


def test_nll_loss_edge_cases():
    x = _rand(4, 3)
    check(lambda x, t: F.nll_loss(x, t), x, torch.full((4,), -100))            # all ignored: nan
    check(lambda x, t: F.nll_loss(x, t, reduction="sum"), x, torch.full((4,), -100))
    check(lambda x, t: F.nll_loss(x, t, reduction="none"), x[0], torch.tensor(2))   # unbatched
    check(lambda x, t: F.nll_loss(x, t), x[0], torch.tensor(1))
    check(lambda x, t: F.nll_loss(x, t), _rand(5, 4).t(), torch.tensor([0, 3, 1, 2]))  # non-contig
    check(lambda x, t: F.nll_loss(x, t, reduction="none"), torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss2d(reduction):
    x = _rand(2, 4, 3, 5).requires_grad_()
    g = torch.Generator().manual_seed(3)
    t = torch.randint(0, 4, (2, 3, 5), generator=g)
    t[0, 1] = -1
    w = _unif(4) + 0.1
    check(lambda x, t, w: F.nll_loss(x, t, w, ignore_index=-1, reduction=reduction), x, t, w, grad=True)


def test_cross_entropy_label_smoothing_end_to_end():
    x = (_rand(8, 13) * 3).requires_grad_()
    t, w = _targets(8, 13, ignore=4), _rand(13, seed=5).abs() + 0.5
    check(lambda x, t: F.cross_entropy(x, t, ignore_index=4, label_smoothing=0.1), x, t, grad=True)
    check(lambda x, t, w: F.cross_entropy(x, t, w, ignore_index=4, label_smoothing=0.1,
                                          reduction="sum"), x, t, w, grad=True)
    check(lambda x, t: F.cross_entropy(x, t, reduction="none"), x, t, grad=True)


def test_cross_entropy_bf16_forward():
    # forward only: the bf16 gradient is a chain of ops each rounding to bf16, and torch's
    # CPU kernels round intermediates differently (values near 0 differ by ~1e-4)
    x, t = (_rand(8, 13) * 3).bfloat16(), _targets(8, 13, ignore=4)
    check(lambda x, t: F.cross_entropy(x, t, ignore_index=4, label_smoothing=0.1), x, t)


def test_cross_entropy_probability_targets():
    x = _rand(5, 6).requires_grad_()
    p = torch.softmax(_rand(5, 6, seed=4), 1)
    check(lambda x, p: F.cross_entropy(x, p, label_smoothing=0.2), x, p, grad=True)


# -- cross entropy: edge values and CPU's argument checks, eager and compiled ------------------
INF = float("inf")
MODES = ["eager", "compiled"]
# the fused op's impls: its XLA lowering, or the Pallas kernel (interpret mode)
KINDS = {"xla": lambda: registry.only("xla"), "pallas": registry.interpret}
# the edge-case tests in each mode x kind; the compiled Pallas one is thorough (CI time:
# eager-pallas checks the kernel's edge cases, compiled-xla the compiled route's)
MODE_KIND = [pytest.param(m, k, marks=pytest.mark.thorough) if (m, k) == ("compiled", "pallas") else (m, k)
             for m in MODES for k in sorted(KINDS)]


def _in(mode: str, fn):
    """``fn``; "compiled": tpu arguments go through torch.compile(fn, backend="tpu") (CPU
    runs ``fn`` as is). A fresh Dynamo cache: one code object compiled per call."""
    if mode == "eager":
        return fn
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpu")
    return lambda *a: (compiled if a[0].device.type == "tpu" else fn)(*a)


@pytest.mark.parametrize(("mode", "kind"), MODE_KIND)
def test_cross_entropy_minus_inf_logits(mode, kind):
    """A -inf logit (a masked class) gives CPU's finite loss: no smoothing term (0 * inf)
    unless label_smoothing > 0 (then inf, as CPU); negative smoothing is none; an ignored
    row whose ignore_index class is -inf stays 0."""
    x = torch.tensor([[0.0, -INF, 1.0], [2.0, 1.0, -INF], [1.0, 0.5, -INF]]).requires_grad_()
    t, w = torch.tensor([0, 1, 2]), torch.tensor([1.0, 2.0, 3.0])
    with KINDS[kind]():
        for ls in (0.0, 0.2, -0.1):
            for r in REDUCTIONS:
                check(_in(mode, lambda x, t, w: F.cross_entropy(x, t, w, ignore_index=2, reduction=r,
                                                                label_smoothing=ls)), x, t, w, grad=True)
        check(_in(mode, lambda x, t: F.cross_entropy(x, t)), x, torch.tensor([0, 1, 0]), grad=True)


@pytest.mark.parametrize(("mode", "kind"), MODE_KIND)
def test_cross_entropy_every_target_ignored(mode, kind):
    """The mean is nan (0 / 0) as on CPU, and the gradient zero, not nan."""
    x, t, w = _rand(4, 5).requires_grad_(), torch.full((4,), -100), _unif(5) + 0.5
    with KINDS[kind]():
        for r in REDUCTIONS:
            for ls in (0.0, 0.1):
                check(_in(mode, lambda x, t: F.cross_entropy(x, t, reduction=r, label_smoothing=ls)),
                      x, t, grad=True)
                check(_in(mode, lambda x, t, w: F.cross_entropy(x, t, w, reduction=r, label_smoothing=ls)),
                      x, t, w, grad=True)


_BYTE_TARGETS = torch.tensor([0, 156, 255, 7, 200], dtype=torch.uint8)   # 156: -100 as a byte


@pytest.mark.parametrize("mode", MODES)
def test_byte_targets(mode):
    """uint8 class indices work as on CPU: past 255 classes, and 156 is not ignore_index
    -100 wrapped to a byte. (F.nll_loss only eager: torch.compile's fake tensors refuse
    uint8 targets, on CPU too.)"""
    x = _rand(5, 300).requires_grad_()
    for r in REDUCTIONS:
        check(_in(mode, lambda x, t: F.cross_entropy(x, t, reduction=r)), x, _BYTE_TARGETS, grad=True)
        if mode == "eager":
            check(lambda x, t: F.nll_loss(x, t, reduction=r), x, _BYTE_TARGETS, grad=True)


_X, _T = _rand(4, 5), torch.tensor([0, 1, 3, 2])
BAD_ARGS = {   # name: (call, arguments, CPU's error)
    "ce_int32_target": (F.cross_entropy, (_X, _T.int()), "expected target dtype to be Long or Byte, but got Int"),
    "ce_int16_target": (F.cross_entropy, (_X, _T.short()), "expected target dtype to be Long or Byte, but got Short"),
    "ce_double_weight": (F.cross_entropy, (_X, _T, torch.ones(5, dtype=torch.float64)),
                         "expected scalar type Float but found Double"),
    "ce_float_weight_of_bf16": (F.cross_entropy, (_X.bfloat16(), _T, torch.ones(5)),
                                "expected scalar type BFloat16 but found Float"),
    "ce_label_smoothing": (lambda x, t: F.cross_entropy(x, t, label_smoothing=1.5), (_X, _T),
                           "label_smoothing must be between 0.0 and 1.0. Got: 1.5"),
    "ce_2d_target": (F.cross_entropy, (_X, _T.repeat(4, 1)), "0D or 1D target tensor expected, multi-target not supported"),
    "ce_spatial_int32_target": (F.cross_entropy, (_rand(2, 5, 3), torch.zeros(2, 3, dtype=torch.int32)),
                                "expected target dtype to be Long or Byte, but got Int"),
    "nll_int32_target": (F.nll_loss, (_X, _T.int()), "expected target dtype to be Long or Byte, but got Int"),
    "nll_double_weight": (F.nll_loss, (_X, _T, torch.ones(5, dtype=torch.float64)),
                          "expected scalar type Float but found Double"),
    "nll_2d_target": (F.nll_loss, (_X, _T.repeat(4, 1)), "0D or 1D target tensor expected, multi-target not supported"),
}


# compiled, a 2-D target fails in Dynamo's fake tensors (torch's decomposition), on CPU too
@pytest.mark.parametrize("name, mode", [(n, m) for n in sorted(BAD_ARGS) for m in MODES
                                        if m == "eager" or not n.endswith("2d_target")])
def test_cross_entropy_bad_arguments_raise_as_cpu(name, mode):
    """CPU's RuntimeError and words (compiled: Dynamo's RuntimeError subclass, quoting them)."""
    fn, args, message = BAD_ARGS[name]
    with pytest.raises(RuntimeError, match=re.escape(message)):
        fn(*args)
    with pytest.raises(RuntimeError, match=re.escape(message)) as raised:
        _in(mode, fn)(*to_tpu(args))
    assert mode == "compiled" or type(raised.value) is RuntimeError


# -- pointwise losses ----------------------------------------------------------------------------
POINTWISE = {
    "mse_loss": lambda x, t, r: F.mse_loss(x, t, reduction=r),
    "huber_loss": lambda x, t, r: F.huber_loss(x, t, reduction=r, delta=0.7),
    "smooth_l1_loss": lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r, beta=0.6),
    "smooth_l1_loss_beta0": lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r, beta=0.0),
    "soft_margin_loss": lambda x, t, r: F.soft_margin_loss(x, t.sign(), reduction=r),
    "bce": lambda x, t, r: F.binary_cross_entropy(torch.sigmoid(x), torch.sigmoid(t), reduction=r),
    "bce_with_logits": lambda x, t, r: F.binary_cross_entropy_with_logits(x, torch.sigmoid(t), reduction=r),
}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", list(POINTWISE))
def test_pointwise_loss(name, reduction):
    fn = POINTWISE[name]
    x, t = (_rand(3, 5) * 2).requires_grad_(), _rand(3, 5, seed=1) * 2
    check(lambda x, t: fn(x, t, reduction), x, t, grad=True)
    check(lambda x, t: fn(x, t, reduction), _rand(5, 3).t().requires_grad_(), t, grad=True)


@pytest.mark.parametrize("name", ["mse_loss", "huber_loss", "bce", "bce_with_logits"])
def test_pointwise_loss_bf16_and_scalar(name):
    fn = POINTWISE[name]
    check(lambda x, t: fn(x, t, "mean"), _rand(4, 6, dtype=torch.bfloat16).requires_grad_(),
          _rand(4, 6, dtype=torch.bfloat16, seed=1), grad=True)
    check(lambda x, t: fn(x, t, "none"), torch.tensor(0.3, requires_grad=True), torch.tensor(-0.2), grad=True)


def test_binary_cross_entropy_weights_and_clamp():
    x = torch.tensor([[0.0, 0.3, 1.0], [0.5, 0.9, 0.1]], requires_grad=True)
    t = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.5]])
    w = torch.tensor([[1.0, 2.0, 0.5], [0.1, 1.0, 3.0]])
    for r in REDUCTIONS:
        check(lambda x, t: F.binary_cross_entropy(x, t, reduction=r), x, t)
        check(lambda x, t, w: F.binary_cross_entropy(x, t, w, reduction=r), x[:, 1:2].detach(), t[:, 1:2], w[:, 1:2])
    y = torch.tensor([[0.2, 0.3, 0.6], [0.5, 0.9, 0.1]], requires_grad=True)
    check(lambda y, t, w: F.binary_cross_entropy(y, t, w), y, t, w, grad=True)


def test_bce_with_logits_weights():
    x, t = (_rand(4, 3) * 5).requires_grad_(), _unif(4, 3)
    w, pw = _unif(4, 3, seed=7), _unif(3, seed=8) * 3
    for r in REDUCTIONS:
        check(lambda x, t, w, pw: F.binary_cross_entropy_with_logits(x, t, w, pos_weight=pw, reduction=r),
              x, t, w, pw, grad=True)


# -- margin losses --------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_loss(p, reduction):
    x = _rand(5, 4).requires_grad_()
    t = torch.tensor([0, 3, 1, 2, 3])
    w = _unif(4) + 0.5
    check(lambda x, t: F.multi_margin_loss(x, t, p=p, margin=0.8, reduction=reduction), x, t, grad=True)
    check(lambda x, t, w: F.multi_margin_loss(x, t, p=p, weight=w, reduction=reduction), x, t, w, grad=True)
    if reduction != "none":
        check(lambda x, t: F.multi_margin_loss(x, t, p=p, reduction=reduction),
              _rand(4).requires_grad_(), torch.tensor(2), grad=True)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multilabel_margin_loss(reduction):
    x = _rand(3, 5).requires_grad_()
    t = torch.tensor([[3, 0, -1, 1, 2], [1, 2, 3, 4, 0], [-1, 1, 2, 0, 0]])
    check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction), x, t, grad=True)
    if reduction != "none":
        check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction),
              _rand(4).requires_grad_(), torch.tensor([2, 2, -1, 0]), grad=True)
    check(lambda x, t: aten.multilabel_margin_loss_forward(x, t, 1), x.detach(), t)


_META_1D = pytest.mark.xfail(strict=True, reason=(
    "torch's meta functions give shape (1,) for an unbatched input with reduction='none', "
    "its CPU kernels give (); the dispatcher follows the meta function"))


@_META_1D
def test_multi_margin_loss_unbatched_none():
    check(lambda x, t: F.multi_margin_loss(x, t, reduction="none"), _rand(4), torch.tensor(2))


@_META_1D
def test_multilabel_margin_loss_unbatched_none():
    check(lambda x, t: F.multilabel_margin_loss(x, t, reduction="none"), _rand(4), torch.tensor([2, -1, 0, 0]))


# -- CTC ---------------------------------------------------------------------------------------------
def _ctc_inputs(t=6, n=3, c=5):
    x = _rand(t, n, c).requires_grad_()
    targets = torch.tensor([[1, 2, 2], [3, 0, 0], [4, 4, 1]])
    return x, targets


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_ctc_loss_padded_targets(reduction):
    x, targets = _ctc_inputs()
    check(lambda x, t: F.ctc_loss(x.log_softmax(2), t, [6, 4, 5], [3, 1, 0], reduction=reduction),
          x, targets, grad=True)


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_concatenated_targets_tensor_lengths(zero_infinity):
    x, _ = _ctc_inputs()
    flat = torch.tensor([1, 2, 2, 3, 4, 4, 1, 2])
    # the third sequence cannot emit 4 labels in 2 steps: an infinite loss
    il, tl = torch.tensor([6, 4, 2]), torch.tensor([3, 1, 4])
    check(lambda x, t, il, tl: F.ctc_loss(x.log_softmax(2), t, il, tl, reduction="none",
                                          zero_infinity=zero_infinity), x, flat, il, tl, grad=zero_infinity)


@pytest.mark.parametrize("lengths", [((7, 4, 5), (3, 1, 0)), ((6, 4, 5), (3, 4, 0))], ids=["input", "target"])
def test_ctc_loss_lengths_past_the_input_raise_as_cpu(lengths):
    """tpu length tensors: a length past the input or the padded targets returned NaN or a
    value (XLA reads clamped); CPU reads the lengths and raises."""
    x, targets = _ctc_inputs()
    il, tl = (torch.tensor(v) for v in lengths)
    with pytest.raises(RuntimeError) as want:
        F.ctc_loss(x.log_softmax(2), targets, il, tl)
    with pytest.raises(RuntimeError, match=re.escape(str(want.value))):
        F.ctc_loss(x.detach().to("tpu").log_softmax(2), targets.to("tpu"), il.to("tpu"), tl.to("tpu"))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_with_lengths_on_the_cpu(reduction):
    """Length tensors left on the CPU beside tpu log-probs, as CUDA's kernel takes them (it
    reads them there). The mean reduction divides by the target lengths on the loss's
    device, as torch's plain-tensor path does (runtime_ops/ctc_loss.py)."""
    x, _ = _ctc_inputs()
    flat = torch.tensor([1, 2, 2, 3, 4, 4, 1])
    il, tl = torch.tensor([6, 4, 5]), torch.tensor([3, 1, 3])
    want = F.ctc_loss(x.log_softmax(2), flat, il, tl, reduction=reduction)
    xt = x.detach().to("tpu").requires_grad_()
    got = F.ctc_loss(xt.log_softmax(2), flat.to("tpu"), il, tl, reduction=reduction)
    torch.testing.assert_close(got.cpu(), want)
    want.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad, atol=1e-6, rtol=1e-5)


def test_ctc_loss_unbatched_and_log_alpha():
    x = _rand(5, 4).requires_grad_()
    check(lambda x, t: F.ctc_loss(x.log_softmax(1), t, [5], [2]), x, torch.tensor([1, 3]), grad=True)
    lp = _rand(6, 3, 5).log_softmax(2)
    targets = torch.tensor([[1, 2, 2], [3, 0, 0], [4, 4, 1]])
    nll, alpha = aten._ctc_loss(lp, targets, [6, 4, 5], [3, 1, 0])
    tnll, talpha = aten._ctc_loss(*to_tpu((lp, targets)), [6, 4, 5], [3, 1, 0])
    assert_same(nll, tnll, "ctc nll")
    talpha = talpha.cpu()
    for b, (t, n) in enumerate(zip([6, 4, 5], [3, 1, 0])):   # torch leaves the rest uninitialised
        torch.testing.assert_close(talpha[b, :t, : 2 * n + 1], alpha[b, :t, : 2 * n + 1])
