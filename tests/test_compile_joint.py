"""A compiled training graph's forward and backward run as one program once its backward
is ``loss.backward()`` (compile_joint.py): gradients as without it, in every way the
backward can differ from the one computed at the forward."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tpu_kernels import compile_backend, compile_joint


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp(dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(16, 4))


def _data(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 8, generator=g).to(device), torch.randn(6, 4, generator=g).to(device)


def _compiled(m: torch.nn.Module, two_outputs: bool = False):
    def loss(x, y):
        out = m(x)
        return (out, F.mse_loss(out, y)) if two_outputs else F.mse_loss(out, y)
    return torch.compile(loss, backend="tpu")


def _grads(m: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().cpu() for p in m.parameters()]


def _reference(backward=lambda loss: loss.backward()) -> list[torch.Tensor]:
    m = _mlp()
    x, y = _data()
    backward(F.mse_loss(m(x), y))
    return _grads(m)


def _warm(m: torch.nn.Module, fn, x, y, two_outputs: bool = False) -> None:
    """Steps enough for the joint program to run (checked)."""
    for _ in range(compile_joint.WARMUP + 1):
        m.zero_grad()
        out = fn(x, y)
        (out[1] if two_outputs else out).backward()
    assert _forward(fn).joint.calls == 1


def _warmed(two_outputs: bool = False, dropout: float = 0.0):
    """A tpu MLP, its compiled loss, the data, after ``_warm``."""
    m = _mlp(dropout).to("tpu")
    fn = _compiled(m, two_outputs)
    x, y = _data("tpu")
    _warm(m, fn, x, y, two_outputs)
    return m, fn, x, y


def _forward(fn):
    return next(p for p in reversed(compile_backend.PROGRAMS) if p.role == "forward")


def _assert_grads(m: torch.nn.Module, expected: list[torch.Tensor]) -> None:
    for got, want in zip(_grads(m), expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_training_matches_cpu_and_runs_one_program_a_step():
    cpu = _mlp()
    m = _mlp().to("tpu")
    opts = [torch.optim.AdamW(n.parameters(), lr=1e-2) for n in (cpu, m)]
    fn = _compiled(m)
    (x, y), (tx, ty) = _data(), _data("tpu")
    for _ in range(6):
        for opt in opts:
            opt.zero_grad()
        F.mse_loss(cpu(x), y).backward()
        loss = fn(tx, ty)
        loss.backward()
        for opt in opts:
            opt.step()
        _assert_grads(m, _grads(cpu))
    fwd = _forward(fn)
    assert fwd.calls == compile_joint.WARMUP and fwd.joint.calls == 6 - compile_joint.WARMUP
    for p, q in zip(m.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("two_outputs", [False, True], ids=["loss", "logits_and_loss"])
def test_retain_graph_and_autograd_grad(two_outputs):
    m, fn, x, y = _warmed(two_outputs)
    m.zero_grad()
    loss = fn(x, y)[1] if two_outputs else fn(x, y)
    loss.backward(retain_graph=True)
    loss.backward()
    _assert_grads(m, [2 * g for g in _reference()])
    got = torch.autograd.grad(fn(x, y)[1] if two_outputs else fn(x, y), list(m.parameters()))
    for g, want in zip(got, _reference()):
        torch.testing.assert_close(g.cpu(), want, atol=1e-5, rtol=1e-5)
    assert _forward(fn).joint.calls == 3


def test_a_backward_it_did_not_compute_runs_the_forward_again_then_separately():
    m, fn, x, y = _warmed()
    m.zero_grad()
    (fn(x, y) * 3).backward()           # the loss's gradient is 3, not the seed
    _assert_grads(m, [3 * g for g in _reference()])
    fwd = _forward(fn)
    calls, joint_calls = fwd.calls, fwd.joint.calls
    m.zero_grad()
    fn(x, y).backward()
    _assert_grads(m, _reference())
    assert (fwd.calls, fwd.joint.calls) == (calls + 1, joint_calls)    # off for good


def test_an_eager_loss_on_the_output_never_takes_it():
    m = _mlp().to("tpu")
    fn = _compiled(m, two_outputs=True)
    x, y = _data("tpu")
    for _ in range(compile_joint.WARMUP + 2):
        m.zero_grad()
        out, _ = fn(x, y)
        F.mse_loss(out, y).backward()
    _assert_grads(m, _reference())
    assert not hasattr(_forward(fn), "joint")


def test_create_graph_runs_the_separate_backward():
    m, fn, x, y = _warmed()
    got = torch.autograd.grad(fn(x, y), list(m.parameters()), create_graph=True)
    for g, want in zip(got, _reference()):
        torch.testing.assert_close(g.detach().cpu(), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="double backward"):
        got[0].sum().backward()


def test_a_saved_input_written_before_backward_raises_as_eagerly():
    m, fn, x, y = _warmed()
    loss = fn(x, y)
    x.add_(1.0)                         # saved for backward (the first weight's gradient needs it)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_seed_written_in_place_is_not_a_seed():
    m, fn, x, y = _warmed()
    m.zero_grad()
    loss = fn(x, y)
    loss.register_hook(lambda g: g.mul_(2))     # (hooks should not write their argument)
    loss.backward()
    _assert_grads(m, [2 * g for g in _reference()])


def test_dropout_draws_the_same_masks_joint_separate_and_rerun(monkeypatch):
    m, fn, x, y = _warmed(dropout=0.5)

    def grads(on: bool, scale: float = 1.0) -> list[torch.Tensor]:
        monkeypatch.setattr(compile_joint, "ON", on)
        torch.manual_seed(5)
        m.zero_grad()
        (fn(x, y) * scale if scale != 1.0 else fn(x, y)).backward()
        return _grads(m)
    fwd = _forward(fn)
    joint, separate = grads(True), grads(False)
    rerun = grads(True, scale=3.0)        # a miss: the forward again, with the joint's key
    assert (fwd.joint.calls, fwd.calls) == (3, compile_joint.WARMUP + 2)
    for j, s, r in zip(joint, separate, rerun):
        torch.testing.assert_close(j, s, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(r, 3 * s, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(joint[0], _reference()[0])    # (the masks dropped something)


def test_not_taken_when_switched_off(monkeypatch):
    monkeypatch.setattr(compile_joint, "ON", False)
    m = _mlp().to("tpu")
    fn = _compiled(m)
    x, y = _data("tpu")
    for _ in range(compile_joint.WARMUP + 2):
        m.zero_grad()
        fn(x, y).backward()
    assert not hasattr(_forward(fn), "joint")


def test_an_unsaved_input_written_before_a_backward_it_did_not_compute_raises():
    m, fn, x, y = _warmed()
    loss = fn(x, y)
    with torch.no_grad():
        m[3].bias.add_(1.0)             # read by the forward only: eagerly, no error
    with pytest.raises(RuntimeError, match="TPU_KERNELS_COMPILE_JOINT=0"):
        (loss * 3).backward()           # the forward must run again, on the old bias


def test_switched_off_and_on_between_calls(monkeypatch):
    m, fn, x, y = _warmed()
    fwd = _forward(fn)
    for on, calls in [(False, (fwd.calls + 1, 1)), (True, (fwd.calls + 1, 2))]:
        monkeypatch.setattr(compile_joint, "ON", on)
        m.zero_grad()
        fn(x, y).backward()
        _assert_grads(m, _reference())
        assert (fwd.calls, fwd.joint.calls) == calls


def test_a_growing_convolution_in_the_joint_program_reads_its_input_through_a_barrier(monkeypatch):
    """XLA:TPU computes such a convolution's weight gradient wrongly when its input is made
    in the same program (``registry/xla/conv_strided.py``): on a v5e, this model's compiled
    steps were 0.8-0.9 off from the third step on (the joint program's first) without the
    barrier (``bench/results/tpu_v5e/2026-12-07-s43.md``). The joint program traces it."""
    from jax import lax
    barriers = []
    real = lax.optimization_barrier
    monkeypatch.setattr(lax, "optimization_barrier", lambda x: barriers.append(1) or real(x))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.Tanh(),
                            torch.nn.ConvTranspose2d(4, 2, 4, stride=2, padding=1)).to("tpu")
    fn = torch.compile(lambda x: (m(x) ** 2).mean(), backend="tpu")
    x = torch.randn(2, 2, 5, 5)
    for _ in range(compile_joint.WARMUP):
        m.zero_grad()
        fn(x.to("tpu")).backward()
    barriers.clear()
    m.zero_grad()
    fn(x.to("tpu")).backward()
    assert _forward(fn).joint.calls == 1 and barriers, "the joint program holds no barrier"
    ref = copy.deepcopy(m).cpu()
    ref.zero_grad()
    (ref(x) ** 2).mean().backward()
    for got, want in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(got.grad.cpu(), want.grad, atol=1e-5, rtol=1e-5)
