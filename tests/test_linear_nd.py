"""F.linear of an N-d input (N > 2) runs as one N-d contraction on tpu (tpu_kernels::linear):
no flatten to 2-D, the same values and gradients as CPU torch, torch's errors, and torch's
own path wherever the fused op does not apply."""
from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import RecordOps, check
from tpu_kernels import dispatch, registry

LINEAR = torch.ops.tpu_kernels.linear.default


def _inputs(shape, bias=True, dtype=torch.float32):
    torch.manual_seed(0)
    x = torch.randn(*shape, 8, dtype=dtype, requires_grad=True)
    w = torch.randn(5, 8, dtype=dtype, requires_grad=True)
    b = torch.randn(5, dtype=dtype, requires_grad=True) if bias else None
    return x, w, b


def _node_names(t: torch.Tensor) -> str:
    return type(t.grad_fn).__name__


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (0, 3)], ids=["3d", "4d", "empty"])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_cpu_values_and_grads(shape, bias):
    x, w, b = _inputs(shape, bias)
    out = check(lambda x, w, b: F.linear(x, w, b), x, w, b, grad=True)
    assert "tpu_kernels_linear" in _node_names(out)


def test_bf16_matches_cpu():
    x, w, b = _inputs((2, 3), dtype=torch.bfloat16)
    out = check(lambda x, w, b: F.linear(x, w, b), x, w, b, grad=True)
    assert out.dtype == torch.bfloat16


def test_2d_input_keeps_torch_addmm():
    x, w, b = _inputs((3,))
    out = F.linear(x.detach().to("tpu").requires_grad_(), w.detach().to("tpu"), b.detach().to("tpu"))
    assert _node_names(out) == "AddmmBackward0"


def test_frozen_weight_gets_no_gradient():
    """Only the gradients that are needed are computed: a frozen weight (LoRA) gets none."""
    x, w, b = _inputs((2, 3))
    xt = x.detach().to("tpu").requires_grad_()
    wt, bt = w.detach().to("tpu"), b.detach().to("tpu")
    F.linear(xt, wt, bt).sum().backward()
    F.linear(x, w.detach(), b.detach()).sum().backward()
    assert wt.grad is None and bt.grad is None
    torch.testing.assert_close(xt.grad.cpu(), x.grad)


def test_double_backward_matches_cpu():
    def grad_norm(x, w, b):
        y = F.linear(x, w, b).pow(2).sum()
        gx, gw = torch.autograd.grad(y, (x, w), create_graph=True)
        return gx.pow(2).sum() + gw.pow(2).sum()
    x, w, b = _inputs((2, 3))
    check(grad_norm, x, w, b, grad=True, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["dtypes", "sizes"])
def test_errors_are_torchs(case):
    x, w, b = _inputs((2, 3))
    x = x.detach()
    w = w.detach().double() if case == "dtypes" else torch.randn(5, 7)
    with pytest.raises(RuntimeError) as cpu:
        F.linear(x, w)
    with pytest.raises(RuntimeError) as tpu:
        F.linear(x.to("tpu"), w.to("tpu"))
    assert str(tpu.value) == str(cpu.value)


def test_lowering_contracts_without_reshape():
    """The lowering is one dot_general over x's last dim; the weight gradient contracts
    every leading dim: no reshape for XLA to fuse around."""
    impl = registry.impls(LINEAR)[-1].fn
    wgrad = registry.impls(torch.ops.tpu_kernels.linear_weight_grad.default)[-1].fn
    x = jax.ShapeDtypeStruct((2, 3, 4, 8), jnp.float32)
    w = jax.ShapeDtypeStruct((5, 8), jnp.float32)
    g = jax.ShapeDtypeStruct((2, 3, 4, 5), jnp.float32)
    for jaxpr in (jax.make_jaxpr(impl)(x, w), jax.make_jaxpr(wgrad)(g, x)):
        prims = {e.primitive.name for e in jaxpr.eqns}
        assert "dot_general" in prims and "reshape" not in prims, prims


def test_compiled_training_matches_cpu():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    mt = copy.deepcopy(m).to("tpu")
    cm = torch.compile(mt, backend="tpu")
    x = torch.randn(2, 3, 8)
    for model, inp in ((m, x), (cm, x.to("tpu"))):
        model(inp).pow(2).sum().backward()
    for (name, p), q in zip(m.named_parameters(), mt.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, msg=name)


def test_pallas_matmul_runs_it():
    """The Pallas tiled matmul is bound to both ops (interpret mode here), forward and the
    weight gradient, with the same values as CPU."""
    wgrad = torch.ops.tpu_kernels.linear_weight_grad.default
    before = {op: dispatch.op_counts().get((str(op), "pallas"), 0) for op in (LINEAR, wgrad)}
    x, w, b = _inputs((2, 4))
    with registry.interpret():
        check(lambda x, w, b: F.linear(x, w, b), x, w, b, grad=True)
    for op in (LINEAR, wgrad):
        assert dispatch.op_counts().get((str(op), "pallas"), 0) > before[op], op


def test_backward_frees_saved_inputs():
    """The op keeps its inputs with save_for_backward: after the backward, a loss that is
    kept (a list of losses, a captured step's result) no longer holds the activations."""
    import weakref
    x, w, _ = _inputs((2, 3))
    xt, wt = x.detach().to("tpu").requires_grad_(), w.detach().to("tpu").requires_grad_()
    hidden = F.linear(xt, wt)
    loss = F.linear(hidden, wt[:, :5]).sum()
    kept = weakref.ref(hidden)
    del hidden
    assert kept() is not None          # the graph needs it until the backward
    loss.backward()
    assert kept() is None


def test_inference_call_skips_the_autograd_layer(monkeypatch):
    """Without a gradient to record (no_grad, or nothing requires grad), the N-d call goes
    straight to the tpu tensors' dispatch (torch.library's autograd layer is Python, ~8 µs
    a call): the same values as CPU, no grad_fn, and the op still counted as itself."""
    through_autograd = []
    op_call = torch.ops.tpu_kernels.linear

    def counted(*args):
        through_autograd.append(args)
        return op_call(*args)
    monkeypatch.setattr(torch.ops.tpu_kernels, "linear", counted)
    x, w, b = _inputs((2, 3))
    want = F.linear(x, w, b).detach()
    xt, wt, bt = (t.detach().to("tpu") for t in (x, w, b))
    before = sum(n for (op, _), n in dispatch.op_counts().items() if op == str(LINEAR))
    with torch.no_grad():
        out = F.linear(xt, wt, bt)
    frozen = F.linear(xt, wt, bt)     # grad enabled, nothing requires it
    for got in (out, frozen):
        assert got.grad_fn is None and not got.requires_grad
        torch.testing.assert_close(got.cpu(), want)
    assert sum(n for (op, _), n in dispatch.op_counts().items() if op == str(LINEAR)) == before + 2
    assert not through_autograd
    F.linear(xt.requires_grad_(), wt, bt)     # a gradient to record: the op's own autograd
    assert len(through_autograd) == 1


def test_inference_call_is_seen_by_a_dispatch_mode():
    """A TorchDispatchMode (a flop counter, a debug mode) sees the op as before: with one
    active the call takes the dispatcher's way."""
    x, w, b = _inputs((2, 3))
    xt, wt, bt = (t.detach().to("tpu") for t in (x, w, b))
    with torch.no_grad(), RecordOps() as mode:
        out = F.linear(xt, wt, bt)
    assert LINEAR in mode.ops
    torch.testing.assert_close(out.cpu(), F.linear(x, w, b).detach())
