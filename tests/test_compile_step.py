"""A compiled training step's programs run as one executable (compile_step.py, opt-in:
``TPU_KERNELS_COMPILE_DEFER=1``, switched on here), with eager semantics: any read of an
output in between runs what is pending."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tpu_kernels import compile_backend, compile_step, deferred_mode, lazy


@pytest.fixture(autouse=True)
def recording_on(monkeypatch):
    monkeypatch.setattr(compile_step, "ON", True)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    lazy.flush()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _data(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 8, generator=g).to(device), torch.randn(6, 4, generator=g).to(device)


def _cpu_losses(steps: int, **backward) -> tuple[list[float], torch.nn.Module]:
    m = _model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x, y = _data()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(m(x), y)
        loss.backward(**backward)
        if backward:
            loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, m


def _assert_params_close(m: torch.nn.Module, ref: torch.nn.Module) -> None:
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-5, msg=name)


def test_compiled_step_is_one_executable_and_matches_cpu():
    expected, ref = _cpu_losses(6)
    m = _model().to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    loss_fn = torch.compile(lambda x, y: F.mse_loss(m(x), y), backend="tpu")
    step = torch.compile(opt.step, backend="tpu")
    x, y = _data("tpu")
    losses, flushes = [], []
    for _ in range(6):
        before = lazy.stats()["flushes"]
        opt.zero_grad()
        loss = loss_fn(x, y)
        loss.backward()
        step()
        losses.append(loss.item())          # the read runs forward, backward and step
        flushes.append(lazy.stats()["flushes"] - before)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), atol=1e-5, rtol=1e-5)
    _assert_params_close(m, ref)
    # after the first calls (they trace, and one compiles the joint forward and backward of
    # compile_joint.py): one run a step
    assert flushes[4:] == [1, 1], flushes


def test_eager_loss_on_a_compiled_model_joins_the_step():
    expected, ref = _cpu_losses(3)
    m = _model().to("tpu")
    cm = torch.compile(m, backend="tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x, y = _data("tpu")
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.mse_loss(cm(x), y)          # eager ops on the compiled forward's output
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), atol=1e-5, rtol=1e-5)
    _assert_params_close(m, ref)


def test_reading_the_forward_output_before_backward():
    m = _model().to("tpu")
    ref = _model()
    cm = torch.compile(m, backend="tpu")
    x, y = _data("tpu")
    for _ in range(3):                       # the later calls are recorded
        m.zero_grad()
        out = cm(x)
        seen = out.cpu()                     # forces the forward alone
        loss = F.mse_loss(out, y)
        loss.backward()
    ref_out = ref(x.cpu())
    F.mse_loss(ref_out, y.cpu()).backward()
    torch.testing.assert_close(seen, ref_out.detach(), atol=1e-5, rtol=1e-5)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-5, rtol=1e-5)


def test_retain_graph_and_two_backwards_accumulate():
    expected, ref = _cpu_losses(3, retain_graph=True)
    m = _model().to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    loss_fn = torch.compile(lambda x, y: F.mse_loss(m(x), y), backend="tpu")
    x, y = _data("tpu")
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = loss_fn(x, y)
        loss.backward(retain_graph=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), atol=1e-5, rtol=1e-5)
    _assert_params_close(m, ref)


def test_a_loop_that_never_reads_runs_one_step_at_a_time():
    m = _model().to("tpu")
    loss_fn = torch.compile(lambda x, y: F.mse_loss(m(x), y), backend="tpu")
    x, y = _data("tpu")
    for _ in range(5):
        loss_fn(x, y).backward()
        pending = lazy._STATE.program
        assert pending is None or len(pending.nodes) <= lazy.UNTIL_FLUSH_MAX_NODES
    lazy.flush()
    assert not lazy.recording()              # the recording the step started has ended


def test_inside_deferred_mode_and_switched_off(monkeypatch):
    expected, ref = _cpu_losses(3)
    for on in (True, False):
        monkeypatch.setattr(compile_step, "ON", on)
        torch._dynamo.reset()
        m = _model().to("tpu")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        loss_fn = torch.compile(lambda x, y: F.mse_loss(m(x), y), backend="tpu")
        x, y = _data("tpu")
        losses = []
        for _ in range(3):
            with deferred_mode.deferred():
                opt.zero_grad()
                loss = loss_fn(x, y)
                loss.backward()
                opt.step()
            assert not lazy.recording()
            losses.append(loss.item())
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), atol=1e-5, rtol=1e-5)
        _assert_params_close(m, ref)


def test_deferred_program_roles():
    m = _model().to("tpu")
    cm = torch.compile(m, backend="tpu")
    x, _ = _data("tpu")
    start = len(compile_backend.PROGRAMS)
    cm(x).sum().backward()
    with torch.no_grad():
        cm(x)
    defers = [p.defers for p in compile_backend.PROGRAMS[start:]]
    # forward and backward record; the inference graph (writes no input) runs at once
    assert defers == [True, True, False], defers


def test_a_repeating_training_step_keeps_recording():
    m = _model().to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    loss_fn = torch.compile(lambda x, y: F.mse_loss(m(x), y), backend="tpu")
    x, y = _data("tpu")
    start = len(compile_backend.PROGRAMS)
    for _ in range(3 * compile_step.MAX_NEW_FUSIONS):
        opt.zero_grad()
        loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        loss.item()
    programs = compile_backend.PROGRAMS[start:]
    assert programs and all(p.defers for p in programs)   # forward, backward, optimizer
