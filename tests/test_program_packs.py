"""A compiled optimizer step's small state (moments, step counts) travels packed
(program_packs.py; on by default on a TPU, switched on here): values equal the unpacked
program's and CPU's, parameters stay out of the packs, and reading, writing or replacing
the state between steps gives eager's values."""
from __future__ import annotations

import weakref

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tpu_kernels import compile_backend, graph_packing, lazy, program_packs
from tpu_kernels.testing import assert_same


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    monkeypatch.setattr(program_packs, "ON", True)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _data(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 8, generator=g).to(device), torch.randn(6, 4, generator=g).to(device)


def _train(device: str, steps: int, between=None, compiled: bool = True):
    """``steps`` AdamW steps of the model on ``device`` (the optimizer step compiled);
    ``between(step, opt)`` runs after each step. Returns (model, optimizer, losses)."""
    m = _model().to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    step = torch.compile(opt.step, backend="tpu") if compiled else opt.step
    x, y = _data(device)
    losses = []
    for i in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(m(x), y)
        loss.backward()
        step()
        losses.append(loss.item())
        if between is not None:
            between(i, opt)
    return m, opt, losses


def _optimizer_program():
    progs = [p for p in compile_backend.PROGRAMS if p.donated]
    assert progs, "no compiled program writes its inputs"
    return progs[-1]


def _assert_trained_alike(m, losses, ref, ref_losses):
    assert_same(torch.tensor(ref_losses), torch.tensor(losses))
    for p, q in zip(m.parameters(), ref.parameters()):
        assert_same(q.detach(), p.detach().cpu())


def test_state_is_packed_and_training_matches_cpu():
    ref, _, ref_losses = _train("cpu", 5, compiled=False)
    m, opt, losses = _train("tpu", 5)
    _assert_trained_alike(m, losses, ref, ref_losses)
    prog = _optimizer_program()
    plans = [p for p in prog._packs.values() if p is not None]
    assert len(plans) == 1
    params = {id(p._tpu_storage) for p in m.parameters()}
    members = [st for _, st in plans[0].storages]
    # both moments and the step count of each of the 4 parameters; no parameter
    assert len(members) == 12 and not params & {id(st) for st in members}
    assert all(type(st.array) is lazy.Lazy for st in members)
    # the packed program returns one buffer for them, not 12 arrays
    assert len(plans[0].slots) == 12 and len(plans[0].packs) == 1
    # planned from a trace alone: only the packed variant was compiled
    assert prog._jitted._cache_size() == 0 and prog.traces == 1
    assert [j._cache_size() for j in prog._packed_jits.values()] == [1]


def test_values_equal_the_unpacked_program(monkeypatch):
    m, opt, losses = _train("tpu", 4)
    torch._dynamo.reset()
    monkeypatch.setattr(program_packs, "ON", False)
    m2, opt2, losses2 = _train("tpu", 4)
    assert losses == losses2
    for p, q in zip(m.parameters(), m2.parameters()):
        assert torch.equal(p.cpu(), q.cpu())
    for p, q in zip(m.parameters(), m2.parameters()):
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][k].cpu(), opt2.state[q][k].cpu()), k


def test_state_read_between_steps_is_current_and_a_plan_read_every_step_retires(monkeypatch):
    cuts = []
    real_fill = graph_packing.Pack.fill
    monkeypatch.setattr(graph_packing.Pack, "fill", lambda self, p: cuts.append(1) or real_fill(self, p))
    seen, seen_ref = [], []

    def read(i, opt, into):
        p = opt.param_groups[0]["params"][0]
        into.append((opt.state[p]["exp_avg"].cpu().clone(), float(opt.state[p]["step"])))
    ref, _, ref_losses = _train("cpu", 6, lambda i, o: read(i, o, seen_ref), compiled=False)
    m, opt, losses = _train("tpu", 6, lambda i, o: read(i, o, seen))
    _assert_trained_alike(m, losses, ref, ref_losses)
    for (a, s), (b, t) in zip(seen_ref, seen):
        assert_same(a, b)
        assert s == t
    # one cut per read while packed; then the plan is dropped and the state is unpacked
    assert cuts and len(cuts) <= program_packs.RETIRE_AFTER + 2
    assert list(_optimizer_program()._packs.values()) == [None]


def test_state_written_between_steps_is_packed_again():
    def reset_moments(i, opt):
        if i == 1:
            for st in opt.state.values():
                st["exp_avg"].zero_()
    ref, _, ref_losses = _train("cpu", 4, reset_moments, compiled=False)
    m, opt, losses = _train("tpu", 4, reset_moments)
    _assert_trained_alike(m, losses, ref, ref_losses)
    assert [p for p in _optimizer_program()._packs.values() if p is not None]


def test_state_loaded_from_a_state_dict_is_packed_again():
    def reload(i, opt):
        if i == 1:
            opt.load_state_dict(opt.state_dict())
    ref, _, ref_losses = _train("cpu", 4, reload, compiled=False)
    m, opt, losses = _train("tpu", 4, reload)
    _assert_trained_alike(m, losses, ref, ref_losses)
    plan = next(p for p in _optimizer_program()._packs.values() if p is not None)
    state = {id(t._tpu_storage) for s in opt.state.values() for t in s.values()}
    assert {id(st) for _, st in plan.storages} <= state


def test_placeholders_nobody_touched_stand_for_the_next_buffer():
    """Between steps that touch no member, each member storage keeps its placeholder
    (no new one a step); its version still moves on, so a view's value cached before is
    read anew, and equals CPU's."""
    kept, views, seen = [], {}, {"cpu": [], "tpu": []}

    def between(i, opt):
        st = opt.state[opt.param_groups[0]["params"][0]]["exp_avg"]
        dev = st.device.type
        if dev not in views:       # one view, made after step 0; each read caches its value
            views[dev] = st[1:3]
        if dev == "tpu":    # (a weak reference: a strong one would hold it)
            before = kept[-1][0]() if kept else None
            kept.append((weakref.ref(st._tpu_storage.array), st._tpu_storage.version,
                         st._tpu_storage.array is before))
        if i in (0, 2, 3):
            seen[dev].append(views[dev].cpu().clone())
    ref, _, ref_losses = _train("cpu", 4, between, compiled=False)
    m, opt, losses = _train("tpu", 4, between)
    _assert_trained_alike(m, losses, ref, ref_losses)
    assert len(seen["tpu"]) == len(seen["cpu"]) == 3
    for a, b in zip(seen["cpu"], seen["tpu"]):
        assert_same(a, b)
    # nothing read the state between steps 1 and 2 only: step 2 kept step 1's placeholder
    assert [same for _, _, same in kept] == [False, False, True, False]
    assert kept[2][1] > kept[1][1]


@pytest.mark.parametrize("overwritten", ["one", "all"])
def test_a_placeholder_held_beyond_its_storage_keeps_its_step(overwritten):
    """A member's placeholder kept by a holder that has not read it (a variable here; a
    deferred recording in the runtime) reads its own step's value after the next step,
    also when its storage, or every member's storage, was written over in between (the
    buffer is cut up before it is given to the next step)."""
    held, ref_values = [], []

    def between(i, opt):
        states = [opt.state[p] for p in opt.param_groups[0]["params"][:2]]
        if i == 1:
            if states[0]["exp_avg"].device.type == "tpu":
                held.extend(s["exp_avg"]._tpu_storage.array for s in states)
            else:
                ref_values.extend(s["exp_avg"].clone() for s in states)
            # (after the holder took its placeholders)
            if overwritten == "all":     # every member: both moments and the step counts
                for t in (t for s in opt.state.values() for t in s.values()):
                    t.zero_()
            else:
                states[1]["exp_avg"].zero_()
    ref, _, ref_losses = _train("cpu", 4, between, compiled=False)
    m, opt, losses = _train("tpu", 4, between)
    _assert_trained_alike(m, losses, ref, ref_losses)
    assert all(type(h) is lazy.Lazy for h in held) and len(held) == 2
    for h, r in zip(held, ref_values):
        assert_same(r, torch.from_numpy(np.array(lazy.concrete(h))))


def test_other_storages_through_one_program_are_planned_again():
    """A compiled function that writes the tensors it is given, called on another set:
    a new plan for the new storages, nothing traced again; the first set, packed by the
    old plan, reads its own values."""
    def update(a, b, c):
        a.add_(1)
        b.mul_(2)
        c.add_(b)
    f = torch.compile(update, backend="tpu")
    sets = [[torch.arange(4.0) + 10 * k for _ in range(3)] for k in range(2)]
    tpu = [[t.to("tpu") for t in ts] for ts in sets]
    for ts, cpu in [(tpu[0], sets[0])] * 3 + [(tpu[1], sets[1])] * 3:
        f(*ts)
        update(*cpu)
    for ts, cpu in zip(tpu, sets):
        for t, c in zip(ts, cpu):
            assert torch.equal(t.cpu(), c)
    prog = _optimizer_program()
    plan = next(p for p in prog._packs.values() if p is not None)
    assert plan.plans == 2 and prog.traces == 1
    assert [st for _, st in plan.storages] == [t._tpu_storage for t in tpu[1]]


def test_a_tensor_learning_rate_with_a_scheduler():
    """The compiled-optimizer loop torch recommends (a tensor lr, so the scheduler's
    changes need no recompile): packed, one trace, CPU's values."""
    def run(device: str, compiled: bool) -> torch.nn.Module:
        m = _model().to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=torch.tensor(1e-2))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i))
        step = torch.compile(opt.step, backend="tpu") if compiled else opt.step
        x, y = _data(device)
        for _ in range(5):
            opt.zero_grad()
            F.mse_loss(m(x), y).backward()
            step()
            sched.step()
        return m
    ref, m = run("cpu", False), run("tpu", True)
    for p, q in zip(m.parameters(), ref.parameters()):
        assert_same(q.detach(), p.detach().cpu())
    prog = _optimizer_program()
    assert prog.traces == 1 and [p is not None for p in prog._packs.values()] == [True]


def test_on_by_default_on_a_tpu_only(monkeypatch):
    monkeypatch.setattr(program_packs, "ON", None)
    assert program_packs.enabled() is (jax.devices()[0].platform == "tpu")
