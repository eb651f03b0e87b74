"""Control flow on tpu tensors (``runtime_ops/control_flow.py``): ``torch.cond``, ``scan``
and ``map``, eager, deferred and compiled, forward and backward, against the same code on
CPU; a compiled cond is one XLA program (a ``stablehlo.case``) that the real TPU compiler
accepts."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan

from tpu_kernels import aot
from tpu_kernels.deferred_mode import deferred


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def close(got, want):
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)


def sin_or_cos(x):
    return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))


class TwoBranches(nn.Module):
    """Each branch uses its own layer and returns two results (a tensor and a scalar)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        y, z = torch.cond(x.sum() > 0, lambda x: (self.a(x).relu(), x.sum()),
                          lambda x: (self.b(x) * 2, x.mean()), (x,))
        # (y.sum() + z would hand the backward two aliasing gradients, which torch 2.13's
        # cond refuses on CPU as well: "cond_true might be aliasing the input or the output")
        return y.sum() + 2 * z


@pytest.mark.parametrize("sign", [1, -1], ids=["true", "false"])
@pytest.mark.parametrize("mode", ["eager", "deferred", "compiled"])
def test_cond_matches_cpu(mode, sign):
    x = torch.randn(5).abs() * sign
    f = torch.compile(sin_or_cos, backend="tpu", fullgraph=True) if mode == "compiled" else sin_or_cos
    with deferred() if mode == "deferred" else torch.no_grad():
        got = f(x.to("tpu"))
    close(got, sin_or_cos(x))


@pytest.mark.parametrize("sign", [1, -1], ids=["true", "false"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_cond_trains_like_cpu(compiled, sign):
    torch.manual_seed(0)
    cpu = TwoBranches()
    tpu = copy.deepcopy(cpu).to("tpu")
    x = (torch.randn(3, 4).abs() * sign).requires_grad_()
    xt = x.detach().to("tpu").requires_grad_()
    f = torch.compile(tpu, backend="tpu", fullgraph=True) if compiled else tpu
    got, want = f(xt), cpu(x)
    close(got, want)
    got.backward()
    want.backward()
    close(xt.grad, x.grad)
    for (name, p), q in zip(tpu.named_parameters(), cpu.parameters()):
        # the branch not taken gives its layer zero gradients, not None (as torch's cond)
        assert p.grad is not None and q.grad is not None, name
        close(p.grad, q.grad)


def test_an_index_check_inside_a_compiled_branch_raises():
    emb = nn.Embedding(10, 3).to("tpu")
    f = torch.compile(lambda i: torch.cond(i.sum() > 0, lambda i: emb(i), lambda i: emb(i) * 2, (i,)),
                      backend="tpu", fullgraph=True)
    close(f(torch.tensor([1, 2], device="tpu")), emb.weight.detach().cpu()[[1, 2]])
    with pytest.raises(IndexError, match="index out of range"):
        f(torch.tensor([1, 20], device="tpu")).cpu()


def test_dropout_inside_a_compiled_branch_draws_a_mask():
    f = torch.compile(lambda x: torch.cond(x.sum() > 0, lambda x: F.dropout(x, 0.5), lambda x: x * 0, (x,)),
                      backend="tpu", fullgraph=True)
    a, b = f(torch.ones(4000, device="tpu")).cpu(), f(torch.ones(4000, device="tpu")).cpu()
    assert set(a.unique().tolist()) == {0.0, 2.0} and 0.45 < (a == 0).float().mean() < 0.55
    assert not torch.equal(a, b)     # each call takes new keys


def running_sum_and_products(init, xs):
    return scan(lambda c, x: (c + x, c * x), init, xs)


def sin_plus_one(xs):
    return hop_map(lambda x: x.sin() + 1, xs)


@pytest.mark.parametrize("fn", [running_sum_and_products, sin_plus_one], ids=["scan", "map"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_loops_match_cpu_with_gradients(fn, compiled):
    args = [torch.randn(3), torch.randn(4, 3)][-fn.__code__.co_argcount:]
    want_in = [a.clone().requires_grad_() for a in args]
    got_in = [a.to("tpu").requires_grad_() for a in args]
    f = torch.compile(fn, backend="tpu", fullgraph=True) if compiled else fn
    got, want = f(*got_in), fn(*want_in)
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    for g, w in zip(got, want):
        close(g, w)
    sum((g * (k + 1)).pow(2).sum() for k, g in enumerate(got)).backward()
    sum((w * (k + 1)).pow(2).sum() for k, w in enumerate(want)).backward()
    for g, w in zip(got_in, want_in):
        close(g.grad, w.grad)


@pytest.mark.skipif(aot.unavailable_reason() is not None, reason=str(aot.unavailable_reason()))
def test_a_compiled_cond_compiles_for_tpu():
    from tpu_kernels.aot import graphs, topology
    from tpu_kernels.aot.compiler import compile_lowered
    from tpu_kernels.pallas import tpu_info

    model = graphs.to_abstract(TwoBranches())
    x = graphs.abstract((8, 4), torch.float32)
    with tpu_info.compile_for("v5e"):
        captured = graphs.capture(lambda m, x: m(x), model, x)
    assert [g.kind for g in captured] == ["forward", "backward"]
    sharding = topology.sharding("v5e")
    for g in captured:
        assert graphs.lower(g, sharding).as_text().count("stablehlo.case") == 1, g.kind
        assert compile_lowered(lambda: graphs.lower(g, sharding), "v5e").summary.flops > 0
