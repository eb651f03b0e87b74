"""Parity of the activation lowerings (registry/xla/activations.py) and their backward ops."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import check

G = torch.Generator()
aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _seed():
    G.manual_seed(0)


def rand(*shape, dtype=torch.float32, scale=4.0):
    x = (torch.rand(*shape, generator=G) * 2 - 1) * scale
    # exact kink points are where implementations differ most: include them
    x.view(-1)[:8] = torch.tensor([0.0, -0.0, 3.0, -3.0, 1.0, -1.0, 0.5, -0.5])[: x.numel()]
    return x.to(dtype)


ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "mish": F.mish,
    "hardtanh": F.hardtanh,
    "hardtanh_range": lambda x: F.hardtanh(x, -0.5, 2.0),
    "relu6": F.relu6,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "elu": lambda x: F.elu(x, 0.7),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, 1.3),
    "softplus": lambda x: F.softplus(x, beta=2.0, threshold=5.0),
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "logsigmoid": F.logsigmoid,
    "hardshrink": lambda x: F.hardshrink(x, 0.5),
    "softshrink": lambda x: F.softshrink(x, 0.5),
    "threshold": lambda x: F.threshold(x, 0.5, -2.0),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "prelu": lambda x, w: F.prelu(x, w),
}


def _args(name, dtype, grad):
    x = rand(6, 3, 5, dtype=dtype).requires_grad_(grad)
    if name == "prelu":
        return x, (torch.rand(3, generator=G) * 0.5).to(dtype).requires_grad_(grad)
    return (x,)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_forward_backward_f32(name):
    check(ACTIVATIONS[name], *_args(name, torch.float32, True), grad=True)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_forward_bf16(name):
    check(ACTIVATIONS[name], *_args(name, torch.bfloat16, False))


def test_noncontiguous_and_shapes():
    x = rand(5, 7).t()
    check(F.gelu, x)
    check(F.silu, torch.tensor(0.3))
    check(F.relu, torch.empty(0, 4))
    check(F.relu, torch.arange(-3, 4))            # int relu
    check(lambda t: F.threshold(t, 1, 0), torch.arange(-3, 4))


def test_inplace():
    check(lambda x: F.relu(x.clone(), inplace=True), rand(4, 4))
    check(lambda x: F.silu(x.clone(), inplace=True), rand(4, 4))
    check(lambda x: F.hardtanh(x.clone(), inplace=True), rand(4, 4))
    check(lambda x: F.leaky_relu(x.clone(), 0.1, inplace=True), rand(4, 4))
    check(lambda x: F.hardswish(x.clone(), inplace=True), rand(4, 4))
    check(lambda x: F.elu(x.clone(), inplace=True), rand(4, 4))


def test_backward_ops_direct():
    g, x = rand(4, 6), rand(4, 6)
    y = torch.sigmoid(x)
    check(aten.sigmoid_backward, g, y)
    check(aten.tanh_backward, g, torch.tanh(x))
    check(lambda a, b: aten.threshold_backward(a, b, 0.0), g, x)
    check(lambda a, b: aten.gelu_backward(a, b, approximate="tanh"), g, x)
    check(aten.gelu_backward, g.bfloat16(), x.bfloat16())
    check(aten.silu_backward, g.bfloat16(), x.bfloat16())
    check(lambda a, b: aten.elu_backward(a, 1.0, 1.0, 1.0, True, F.elu(b)), g, x)
    check(lambda a, b: aten.elu_backward(a, 0.5, 1.2, 0.8, False, b), g, x)
    check(lambda a, b: aten.leaky_relu_backward(a, b, 0.1, False), g, x)
    check(lambda a, b: aten.softplus_backward(a, b, 1.0, 20.0), g, x)
    check(lambda a, b: aten.hardshrink_backward(a, b, 0.5), g, x)
    check(lambda a, b: aten.softshrink_backward(a, b, 0.5), g, x)
    check(aten.hardsigmoid_backward, g, x)
    check(aten.hardswish_backward, g, x)
    check(aten.mish_backward, g, x)
    out, buf = aten.log_sigmoid_forward(x)
    check(aten.log_sigmoid_forward, x)
    check(aten.log_sigmoid_backward, g, x, buf)
    check(aten._prelu_kernel_backward, g, x, torch.full((4, 1), 0.3))


def test_rrelu():
    x = rand(50, 40)
    noise = torch.zeros_like(x)
    check(lambda t, n: aten.rrelu_with_noise(t, n.clone(), 0.1, 0.3, False), x, noise)  # eval: deterministic
    check(lambda t: F.rrelu(t, 0.1, 0.3, training=False), x)
    tx, tn = x.to("tpu"), noise.to("tpu")
    out = aten.rrelu_with_noise(tx, tn, 0.1, 0.3, True).cpu()
    n = tn.cpu()
    neg = x <= 0
    assert torch.equal(n[~neg], torch.ones_like(n[~neg]))
    assert n[neg].min() >= 0.1 and n[neg].max() <= 0.3 and n[neg].std() > 0.03
    torch.testing.assert_close(out, x * n)
    g = rand(50, 40)
    expected = aten.rrelu_with_noise_backward(g, x, n, 0.1, 0.3, True, False)
    actual = aten.rrelu_with_noise_backward(g.to("tpu"), tx, n.to("tpu"), 0.1, 0.3, True, False)
    torch.testing.assert_close(actual.cpu(), expected)
    a = aten.rrelu_with_noise(tx, tn, 0.1, 0.3, True).cpu()
    assert not torch.equal(a, out)  # fresh randomness per call


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [F.silu, F.mish], ids=["silu", "mish"])
def test_half_type_gradients_round_once(fn, dtype):
    # autograd calls silu_backward / mish_backward, which torch decomposes for devices
    # other than CPU/CUDA into ops that each round to the half type (silu's gradient at
    # 8.5 came out as the incoming gradient); tpu runs them whole, float32 inside, as CPU
    x = torch.cat([rand(256, scale=10.0), torch.tensor([8.4765625, 5.0, -6.0, 12.0])]).to(dtype)
    g = rand(260, scale=3.0).to(dtype)
    xc = x.clone().requires_grad_()
    want, = torch.autograd.grad(fn(xc), xc, g)
    xt = x.to("tpu").requires_grad_()
    got, = torch.autograd.grad(fn(xt), xt, g.to("tpu"))
    ulp = torch.finfo(dtype).eps * want.float().abs().clamp_min(1.0)
    assert ((got.cpu().float() - want.float()).abs() <= ulp).all()


def test_activation_backward_ops_on_tensors_that_require_grad():
    # a call with a gradient to record takes torch's decomposition (the values are the same)
    g, x = rand(4, 6), rand(4, 6)
    for op in (aten.silu_backward, aten.mish_backward):
        got = op(g.to("tpu"), x.to("tpu").requires_grad_())
        assert got.requires_grad
        torch.testing.assert_close(got.detach().cpu(), op(g, x))
