"""Deferred eager mode: flushes, errors and limits (training parity with CPU, and one
program per loop step, are tested with the other modes in test_compile_backend.py)."""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch

import tpu_kernels
from tpu_kernels import deferred_mode, lazy, lazy_programs


def test_values_needed_flush_the_recording():
    with tpu_kernels.deferred():
        x = torch.arange(6.0, device="tpu").reshape(2, 3)
        y = (x * 2)[:, 1]
        assert isinstance(y._tpu_storage.array, lazy.Lazy)
        assert y.tolist() == [2.0, 8.0]                        # .cpu() flushes
        z = (x > 2).nonzero()                                  # data-dependent shape flushes
        assert z.shape == (3, 2)
        w = x.sum()
        assert "15." in repr(w)                                # printing flushes
        x.add_(1)                                              # in-place on a recorded value
    assert x.cpu().tolist() == [[1, 2, 3], [4, 5, 6]]


def test_errors_still_raise_in_deferred_mode():
    with tpu_kernels.deferred():
        x = torch.randn(4, device="tpu")
        bad = x.index_select(0, torch.tensor([9], device="tpu"))
    with pytest.raises(IndexError, match="index_select"):
        bad.cpu()


def test_size_limit_flushes(monkeypatch):
    monkeypatch.setattr(lazy, "MAX_NODES", 8)
    before = deferred_mode.stats()["flushes"]
    with tpu_kernels.deferred():
        x = torch.ones(3, device="tpu")
        for _ in range(20):
            x = x + 1
    assert deferred_mode.stats()["flushes"] - before >= 2
    assert x.cpu().tolist() == [21.0, 21.0, 21.0]


def test_backward_and_optimizer_step_run_what_was_recorded_first():
    """A backward and an optimizer step are stage boundaries: the forward's program runs
    (on XLA's threads) while the backward is recorded, the backward's while the optimizer
    step is; each stage's program is cached."""
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model = copy.deepcopy(cpu).to("tpu")
    x = torch.randn(4, 8)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (cpu, model)]
    seen = []

    def step(m, opt, data, defer):
        with tpu_kernels.deferred() if defer else contextlib.nullcontext():
            opt.zero_grad()
            loss = m(data).square().mean()
            if defer:
                seen.append(isinstance(loss._tpu_storage.array, lazy.Lazy))
                before = deferred_mode.stats()["flushes"]
            loss.backward()
            if defer:   # the backward ran the forward: the loss has its value, nothing was lost
                assert deferred_mode.stats()["flushes"] == before + 1
                assert loss._tpu_storage.array.value is not None
                grad = m[0].weight.grad
            opt.step()
            if defer:   # the step ran the backward: the gradients have their values
                assert deferred_mode.stats()["flushes"] == before + 2
                assert grad._tpu_storage.array.value is not None
        return loss

    losses = [(step(cpu, opts[0], x, False).item(), step(model, opts[1], x.to("tpu"), True).item())
              for _ in range(3)]
    compiles = deferred_mode.stats()["compiles"]
    losses.append((step(cpu, opts[0], x, False).item(), step(model, opts[1], x.to("tpu"), True).item()))
    assert deferred_mode.stats()["compiles"] == compiles     # steps after the first two reuse theirs
    assert all(seen)
    torch.testing.assert_close(torch.tensor([t for _, t in losses]), torch.tensor([c for c, _ in losses]))
    for p, q in zip(cpu.parameters(), model.parameters()):
        torch.testing.assert_close(q.cpu(), p, atol=1e-6, rtol=1e-5)


def test_a_run_recording_is_freed_while_its_values_live_on():
    """Placeholders outlive their flush (a parameter's new value, an embedding's unread
    index-check flag): they must not keep their program, and with it every input of
    that step, alive. A loop that never reads a value held every step's inputs until 256
    unread flags piled up (a medium GPT's deferred step: +85 MB and 3x slower a step)."""
    import gc
    import weakref

    emb = torch.nn.Embedding(16, 8).to("tpu")
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    ids = torch.tensor([1, 5, 7], device="tpu")
    programs = []
    for _ in range(3):
        with tpu_kernels.deferred():
            opt.zero_grad()
            loss = emb(ids).square().sum()
            programs.append(weakref.ref(loss._tpu_storage.array.program))
            loss.backward()
            opt.step()
    gc.collect()
    assert [p() for p in programs] == [None, None, None]
    assert emb.weight.grad is not None and loss._tpu_storage.array.program is None


def test_python_numbers_keep_their_weak_types_in_a_recording():
    """A recording takes Python numbers as one host array per type: each still acts as
    a Python number (a float scales a float16 tensor in float16, an int an int32 tensor in
    int32, a bool stays a bool) and its value is exact."""
    cases = {
        "float16 * float": (lambda x: x * 0.1, torch.arange(4, dtype=torch.float16)),
        "int32 * int": (lambda x: x * (2 ** 20 + 1), torch.arange(4, dtype=torch.int32)),
        "float64 + float": (lambda x: x + 1e-300, torch.zeros(2, dtype=torch.float64)),
        "int64 + big int": (lambda x: x + (2 ** 62 + 3), torch.arange(2)),
        "bool ^ bool": (lambda x: x ^ True, torch.tensor([True, False])),
        "mixed": (lambda x: (x * 3 + 0.5) / 2, torch.arange(4, dtype=torch.bfloat16)),
    }
    for name, (f, x) in cases.items():
        want = f(x)
        with tpu_kernels.deferred():
            got = f(x.to("tpu"))
        assert got.dtype == want.dtype, name
        assert torch.equal(got.cpu(), want), name


def test_packed_numbers_are_traced_as_python_numbers():
    """Inside a flushed program a packed float is weakly typed, as JAX traces a Python
    float: float32 times it stays float32 (a float64 number would make it float64)."""
    import jax
    import jax.numpy as jnp

    avals = [((4,), jnp.float32), float, int, bool]
    program = lazy_programs.replay([(lambda a, f, i, b: (a * f + i, jnp.logical_and(a > 0, b)), (0, 1, 2, 3))],
                           ((0, 0), (0, 1)), avals)
    args = lazy_programs.packed([jnp.ones(4, jnp.float32), 0.25, 3, True], avals)
    assert len(args) == 4 and [a.dtype for a in args[1:]] == [jnp.float64, jnp.int64, jnp.bool_]
    scaled, both = jax.jit(program)(*args)
    assert scaled.dtype == jnp.float32 and scaled.tolist() == [3.25] * 4
    assert both.dtype == jnp.bool_ and both.tolist() == [True] * 4


def test_a_compiled_optimizer_step_leaves_the_stage_hook_out_of_its_graph():
    """The optimizer-step boundary is a global optimizer hook, so ``torch.compile(opt.step)``
    traces it: it stays out of the graph (no break, no guard on deferred mode's state), and
    a compiled step inside ``deferred()`` reuses its graph."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(3, 4, device="tpu")
    model(x).sum().backward()
    explained = torch._dynamo.explain(opt.step)()
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    step = torch.compile(opt.step, backend="tpu")
    counts = []
    for defer in (False, True, False, True):
        with tpu_kernels.deferred() if defer else contextlib.nullcontext():
            opt.zero_grad()
            model(x).sum().backward()
            step()
        counts.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert counts[1:] == counts[:1] * 3, counts


def test_a_compiled_function_taking_gradients_inside_deferred_mode():
    """torch.autograd.grad inside a compiled function (a graph break) starts a backward
    from compiled code's eager stretch: the backward-start hook (deferred mode's flush, JAX
    code) must run as it is, not be traced by Dynamo."""
    def f(x):
        out = x.roll(1, 0) * 2
        g, = torch.autograd.grad((out ** 2).sum(), [x])
        return out.detach(), g
    x = torch.randn(4, 3)
    want = f(x.clone().requires_grad_())
    torch._dynamo.reset()
    with deferred_mode.deferred():
        got = torch.compile(f, backend="tpu")(x.to("tpu").requires_grad_())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b)
    torch._dynamo.reset()
