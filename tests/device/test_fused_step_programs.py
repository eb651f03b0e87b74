"""Eager fused optimizer steps run as donating, packing programs
(``tpu_kernels/fused_step_programs.py``) that take their step counters' increment
(``step_counters.py``): they match CPU and the plain route bit for bit, a scheduler's new
``lr`` compiles nothing, the moments packed (as on a TPU) stay readable and writable
between steps, what a user holds keeps its value, a counter read before its step is
right, and calls the programs do not take go the plain route."""
from __future__ import annotations

import contextlib
import copy

import numpy as np
import pytest
import torch

import tpu_kernels
from tpu_kernels import fused_step_programs as fsp
from tpu_kernels import program_packs

STEPS = {
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "Adam amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
    "SGD nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
}


@contextlib.contextmanager
def _setting(programs: bool = True, packs: bool | None = None):
    """Programs on or off, packs on or off (on: as on a TPU), each call's programs new."""
    saved = fsp.ON, program_packs.ON
    fsp.ON, program_packs.ON = programs, packs
    fsp.PROGRAMS.clear()
    try:
        yield
    finally:
        fsp.ON, program_packs.ON = saved
        fsp.PROGRAMS.clear()


def _models():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    return cpu, copy.deepcopy(cpu).to("tpu")


def _step(model, opt, x, sched=None):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
    if sched is not None:
        sched.step()


def _both(n: int, cpu, opt_cpu, tpu, opt_tpu, x, scheds=(None, None)) -> None:
    """``n`` steps of the CPU model and of the tpu one on the same batch."""
    for _ in range(n):
        _step(cpu, opt_cpu, x, scheds[0])
        _step(tpu, opt_tpu, x.to("tpu"), scheds[1])


def _same_parameters(cpu, tpu) -> None:
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(q.cpu(), p)


def _fused(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    for g in opt.param_groups:   # CPU's fused kernel: the same step torch takes on tpu
        g["fused"], g["foreach"] = True, False
    return opt


@pytest.mark.parametrize("packs", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("name", list(STEPS))
def test_a_fused_step_is_one_program_and_matches_cpu(name, packs):
    cpu, tpu = _models()
    with _setting(packs=packs):
        opt_cpu, opt_tpu = _fused(STEPS[name](cpu.parameters())), STEPS[name](tpu.parameters())
        x = torch.randn(4, 6)
        _both(4, cpu, opt_cpu, tpu, opt_tpu, x)
        # the first step is a program of its own (SGD's makes its momentum buffers; Adam's
        # step counters were incremented on their own), the later ones take the counters'
        # increment (step_counters.py)
        first, program = fsp.PROGRAMS.values()
        assert (first.calls, program.calls, program.traces) == (1, 3, 1)
        n_params = len(list(tpu.parameters()))
        # written and donated: parameters, moments (and max_exp_avg_sqs), step counters
        state = {"Adam amsgrad": 4, "AdamW": 3, "SGD nesterov": 1}[name]
        assert len(program.donated) == n_params * (1 + state)
        if packs:
            assert any(p is not None for p in program._packs.values())
    _same_parameters(cpu, tpu)
    for s_cpu, s_tpu in zip(opt_cpu.state.values(), opt_tpu.state.values()):
        for k in s_cpu:
            torch.testing.assert_close(s_tpu[k].cpu(), s_cpu[k])


@pytest.mark.parametrize("name", list(STEPS))
def test_programs_give_the_plain_route_bit_for_bit(name):
    results = []
    for programs in (False, True):
        _, tpu = _models()
        with _setting(programs=programs, packs=True):
            opt = STEPS[name](tpu.parameters())
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).to("tpu")
            for _ in range(3):
                _step(tpu, opt, x)
            assert bool(fsp.PROGRAMS.values()) == programs
        results.append([p.detach().cpu() for p in tpu.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_a_scheduler_changes_lr_without_a_new_program():
    cpu, tpu = _models()
    with _setting(packs=True):
        opt_cpu, opt_tpu = _fused(torch.optim.AdamW(cpu.parameters(), lr=0.05)), torch.optim.AdamW(tpu.parameters(), lr=0.05)
        s_cpu = torch.optim.lr_scheduler.ExponentialLR(opt_cpu, 0.5)
        s_tpu = torch.optim.lr_scheduler.ExponentialLR(opt_tpu, 0.5)
        x = torch.randn(4, 6)
        _both(5, cpu, opt_cpu, tpu, opt_tpu, x, (s_cpu, s_tpu))
        first, program = fsp.PROGRAMS.values()   # (the first step's, then the others')
        assert program.calls == 4 and program.traces == 1
    _same_parameters(cpu, tpu)


def test_packed_moments_read_written_and_held_between_steps():
    """As on a TPU: a moment read between steps (state_dict, a held tensor, ``.jax()``)
    has its value, a loaded state_dict is what the next step starts from."""
    cpu, tpu = _models()
    with _setting(packs=True):
        opt_cpu, opt_tpu = _fused(torch.optim.AdamW(cpu.parameters(), lr=1e-2)), torch.optim.AdamW(tpu.parameters(), lr=1e-2)
        x = torch.randn(4, 6)
        _both(2, cpu, opt_cpu, tpu, opt_tpu, x)
        held = opt_tpu.state[next(tpu.parameters())]["exp_avg"]
        held_array = held.jax()          # a user's own reference: the step must not donate it
        before = held.cpu()
        _both(1, cpu, opt_cpu, tpu, opt_tpu, x)
        torch.testing.assert_close(torch.from_numpy(np.array(held_array)), before)
        torch.testing.assert_close(held.cpu(), opt_cpu.state[next(cpu.parameters())]["exp_avg"])
        saved = copy.deepcopy(opt_cpu.state_dict())
        tpu_saved = opt_tpu.state_dict()
        for s_cpu, s_tpu in zip(saved["state"].values(), tpu_saved["state"].values()):
            torch.testing.assert_close(s_tpu["exp_avg_sq"].cpu(), s_cpu["exp_avg_sq"])
        _both(2, cpu, opt_cpu, tpu, opt_tpu, x)
        opt_cpu.load_state_dict(saved)
        opt_tpu.load_state_dict(saved)     # (CPU state: torch moves it to the parameters)
        _both(2, cpu, opt_cpu, tpu, opt_tpu, x)
    _same_parameters(cpu, tpu)


def test_calls_the_programs_do_not_take_go_the_plain_route():
    """Deferred mode; parameters that are views of one storage."""
    cpu, tpu = _models()
    with _setting():
        opt_cpu, opt_tpu = _fused(torch.optim.AdamW(cpu.parameters(), lr=1e-2)), torch.optim.AdamW(tpu.parameters(), lr=1e-2)
        x = torch.randn(4, 6)
        with tpu_kernels.deferred():
            _step(tpu, opt_tpu, x.to("tpu"))
        _step(cpu, opt_cpu, x)
        assert not fsp.PROGRAMS.values()
        _same_parameters(cpu, tpu)

        flat = torch.zeros(10, device="tpu")
        views = [torch.nn.Parameter(flat[:6].view(2, 3)), torch.nn.Parameter(flat[6:])]   # one storage
        ref = [torch.nn.Parameter(v.detach().cpu()) for v in views]
        opts = torch.optim.AdamW(views, lr=0.1), torch.optim.AdamW(ref, lr=0.1, fused=True)
        for _ in range(2):
            for params, opt in zip((views, ref), opts):
                for p in params:
                    p.grad = torch.ones_like(p)
                opt.step()
        assert not fsp.PROGRAMS.values()
        for v, r in zip(views, ref):
            torch.testing.assert_close(v.detach().cpu(), r.detach())


def test_step_counters_read_between_their_increment_and_the_step_are_right():
    """The increment a fused step takes into its program is pending until then: a read in
    between runs it (torch's value), and the step still counts right; a foreach Adam's
    counters are never left pending."""
    cpu, tpu = _models()
    with _setting(packs=True):
        opt_cpu, opt_tpu = _fused(torch.optim.Adam(cpu.parameters(), lr=1e-2)), torch.optim.Adam(tpu.parameters(), lr=1e-2)
        x = torch.randn(4, 6)
        _both(3, cpu, opt_cpu, tpu, opt_tpu, x)
        steps = [s["step"] for s in opt_tpu.state.values()]
        assert isinstance(steps[0]._tpu_storage.array, tpu_kernels.lazy.Lazy)   # packed
        torch._foreach_add_(steps, 1)                 # left pending...
        assert type(steps[0]._tpu_storage.array.program).__name__ == "PendingAdd"
        assert [s.item() for s in steps] == [4.0] * len(steps)   # ...and run when read
        torch._foreach_add_(steps, -1)
        _both(2, cpu, opt_cpu, tpu, opt_tpu, x)
        assert [s["step"].item() for s in opt_tpu.state.values()] == [5.0] * len(steps)
        _same_parameters(cpu, tpu)

        # (capturable: its counters on the device, each step one ``_foreach_add_`` of them)
        foreach = torch.optim.Adam(copy.deepcopy(tpu).parameters(), lr=1e-2, foreach=True, capturable=True)
        for p in foreach.param_groups[0]["params"]:
            p.grad = torch.ones_like(p)
        foreach.step()
        foreach.step()
        assert all(s["step"].device.type == "tpu" for s in foreach.state.values())
        assert not any(isinstance(s["step"]._tpu_storage.array, tpu_kernels.lazy.Lazy)
                       for s in foreach.state.values())
