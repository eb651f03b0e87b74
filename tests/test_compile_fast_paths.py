"""torch.compile(backend="tpu")'s per-call shortcuts keep results right: inference graphs
called without AOTAutograd's wrappers, shadows kept on the tensor, CPU step counters
updated on the host, written inputs donated to the program."""
from __future__ import annotations

import copy

import pytest
import torch

import tpu_kernels
from tpu_kernels import compile_backend, graph_program


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _backend_result(fn, *args):
    """What the tpu backend handed Dynamo for ``fn``'s one graph, and fn's result."""
    handed = []

    def probe(gm, example_inputs, **kw):
        handed.append(compile_backend.tpu_backend(gm, example_inputs, **kw))
        return handed[-1]
    out = torch.compile(fn, backend=probe)(*args)
    return handed, out


def test_inference_graph_is_called_directly_and_matches_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    tpu = copy.deepcopy(cpu).to("tpu")
    with torch.no_grad():
        handed, out = _backend_result(tpu, x.to("tpu"))
        again = torch.compile(tpu, backend="tpu")(x.to("tpu"))
        expected = cpu(x)
    assert isinstance(handed[0], compile_backend.GraphProgram)   # no AOTAutograd wrapper
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_training_and_aliasing_graphs_are_not_called_as_bare_programs():
    """A training graph goes through an autograd Function (compile_train_fast_path's or
    AOTAutograd's), an aliasing one through AOTAutograd's wrappers: never the bare program."""
    w = torch.randn(4, 4, device="tpu", requires_grad=True)
    handed, _ = _backend_result(lambda x: (x @ w).sum(), torch.randn(2, 4, device="tpu"))
    assert not isinstance(handed[0], compile_backend.GraphProgram)
    torch._dynamo.reset()
    x = torch.randn(2, 6, device="tpu")
    with torch.no_grad():
        handed, out = _backend_result(lambda x: (x.view(3, 4), x * 2), x)
    assert not isinstance(handed[0], compile_backend.GraphProgram)
    assert out[0]._base is x or out[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    torch.testing.assert_close(out[0].cpu(), x.cpu().view(3, 4))


def test_input_mutation_on_the_direct_path_bumps_the_version():
    x = torch.zeros(4, device="tpu")

    def f(x):
        x.add_(1)
        return x * 2
    with torch.no_grad():
        handed, out = _backend_result(f, x)
    version = x._version
    with torch.no_grad():
        out = torch.compile(f, backend="tpu")(x)
    assert x._version > version
    torch.testing.assert_close(x.cpu(), torch.full((4,), 2.0))
    torch.testing.assert_close(out.cpu(), torch.full((4,), 4.0))


def test_a_tensor_whose_geometry_changes_is_read_with_the_new_one():
    x = torch.arange(6.0).reshape(2, 3).to("tpu")
    f = torch.compile(lambda t: t * 2, backend="tpu")
    with torch.no_grad():
        first = f(x)
        x.t_()              # in place: same tensor object, new sizes and strides
        second = f(x)
    torch.testing.assert_close(first.cpu(), torch.arange(6.0).reshape(2, 3) * 2)
    torch.testing.assert_close(second.cpu(), torch.arange(6.0).reshape(2, 3).t() * 2)


def _adamw_pair():
    """A CPU Linear and its tpu copy, an AdamW for each, the tpu one's step compiled, and
    an input."""
    torch.manual_seed(0)
    cpu = torch.nn.Linear(8, 4)
    tpu = copy.deepcopy(cpu).to("tpu")
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_tpu = torch.optim.AdamW(tpu.parameters(), lr=1e-2)
    return cpu, tpu, opt_cpu, opt_tpu, torch.compile(opt_tpu.step, backend="tpu"), torch.randn(2, 8)


def _grads_then_cpu_step(cpu, tpu, opt_cpu, opt_tpu, x) -> None:
    """Fresh gradients on both models, then the CPU optimizer's step."""
    for m, opt, xx in ((cpu, opt_cpu, x), (tpu, opt_tpu, x.to("tpu"))):
        opt.zero_grad()
        m(xx).square().sum().backward()
    opt_cpu.step()


def test_compiled_adamw_step_counts_on_the_device_and_matches_cpu():
    # as torch.compile does for CUDA parameters: the group becomes capturable, the step
    # counters are made on the device, and the program reads no CPU scalars
    cpu, tpu, opt_cpu, opt_tpu, step, x = _adamw_pair()
    start = len(compile_backend.PROGRAMS)
    for _ in range(3):
        _grads_then_cpu_step(cpu, tpu, opt_cpu, opt_tpu, x)
        step()
    assert opt_tpu.param_groups[0]["capturable"] and not opt_cpu.param_groups[0]["capturable"]
    assert all(p.host is None and not p.cpu_inputs for p in compile_backend.PROGRAMS[start:])
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=1e-5)
        assert opt_tpu.state[b]["step"].device.type == "tpu"
        torch.testing.assert_close(opt_tpu.state[b]["step"].cpu(), opt_cpu.state[a]["step"])


def test_a_cpu_counter_a_compiled_graph_bumps_is_updated_on_the_host():
    # host_writes.py: a CPU input whose new value needs CPU inputs only (a custom optimizer's
    # step count) is computed by torch on the host; the program's own copy is not read back
    counter = torch.tensor(0.0)
    w = torch.ones(3, device="tpu")

    def f(x, n):
        n.add_(1)
        return x * n + w

    cf = torch.compile(f, backend="tpu")
    start = len(compile_backend.PROGRAMS)
    outs = [cf(torch.arange(3.0, device="tpu"), counter).cpu() for _ in range(3)]
    (program,) = [p for p in compile_backend.PROGRAMS[start:] if p.host is not None]
    assert len(program.host.written) == 1
    assert counter.device.type == "cpu" and counter.item() == 3.0
    for k, out in enumerate(outs, 1):
        torch.testing.assert_close(out, torch.arange(3.0) * k + 1)


def test_a_compiled_optimizer_step_donates_the_state_it_writes():
    """The parameters and moments a compiled AdamW step writes are donated (XLA writes the
    new values over the old buffers: one copy of the state); an array someone still holds
    (a ``.jax()`` kept) is copied instead, keeps its values, and the step matches CPU."""
    cpu, tpu, opt_cpu, opt_tpu, step, x = _adamw_pair()
    start = len(compile_backend.PROGRAMS)
    kept = None
    for k in range(3):
        _grads_then_cpu_step(cpu, tpu, opt_cpu, opt_tpu, x)
        old_bias = tpu.bias._tpu_storage.array          # held here: must survive
        before = old_bias.copy()
        if k == 2:
            kept = tpu.weight.jax()
            kept_before = kept.copy()
        weight_buffer = tpu.weight._tpu_storage.array.unsafe_buffer_pointer()  # not held
        step()
        if k == 1:   # donated (the first step also makes the state): the new weight, old buffer
            assert tpu.weight._tpu_storage.array.unsafe_buffer_pointer() == weight_buffer
        assert not old_bias.is_deleted()
        assert (old_bias == before).all()
        if k == 2:
            assert not kept.is_deleted() and (kept == kept_before).all()
    (program,) = [p for p in compile_backend.PROGRAMS[start:] if p.donated]
    assert len(program.donated) == 8   # weight, bias, their two moments and step counts
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=1e-5)


def test_an_input_written_in_place_beside_its_view_is_not_lost():
    """A compiled in-place update of an input whose storage another live tensor (a view
    of it) shares: the view sees the new values, the old array is not reused."""
    def f(x):
        x.mul_(2)
        return x + 1
    cf = torch.compile(f, backend="tpu")
    base = torch.arange(6.0)
    t = base.to("tpu")
    view = t[1:4]
    out = cf(t)
    torch.testing.assert_close(out.cpu(), base * 2 + 1)
    torch.testing.assert_close(view.cpu(), (base * 2)[1:4])
    torch.testing.assert_close(cf(t).cpu(), base * 4 + 1)


def test_a_donated_input_the_trace_does_not_write_falls_back_before_running(monkeypatch, caplog):
    """Donation is decided from the graph's ``copy_`` nodes; should a trace not write a
    donated input, the call stops while tracing (before any buffer is given up) and the
    program runs without donation."""
    # as if the graph's copy_ nodes said it writes its input
    monkeypatch.setattr(graph_program, "_written_inputs", lambda gm, positions, cpu: (0,))
    start = len(compile_backend.PROGRAMS)
    cf = torch.compile(lambda x: x + 1, backend="tpu")
    t = torch.arange(4.0).to("tpu")
    with caplog.at_level("WARNING", logger="tpu_kernels.graph_program"):
        out = cf(t)
    (program,) = compile_backend.PROGRAMS[start:]
    assert "no inputs donated" in caplog.text and program.donated == ()
    assert not t._tpu_storage.array.is_deleted()
    torch.testing.assert_close(out.cpu(), torch.arange(4.0) + 1)
    torch.testing.assert_close(cf(t).cpu(), torch.arange(4.0) + 1)


def test_an_input_written_in_deferred_mode_is_copied_not_donated():
    """Inside ``deferred()`` an input's storage holds a placeholder whose value others may
    read: a compiled in-place call gets a copy of it, and every tensor stays readable."""
    f = torch.compile(lambda t: t.add_(1), backend="tpu")
    w = torch.full((4,), 1.0).to("tpu")
    f(w)                                   # 2
    with tpu_kernels.deferred():
        w.mul_(2)                          # 4, recorded: w's storage holds a placeholder
        before = w.clone()
        f(w)                               # 5
        after = w * 1
    torch.testing.assert_close(before.cpu(), torch.full((4,), 4.0))
    torch.testing.assert_close(w.cpu(), torch.full((4,), 5.0))
    torch.testing.assert_close(after.cpu(), torch.full((4,), 5.0))


def test_guards_still_recompile_on_a_new_dtype_shape_layout_or_requires_grad():
    """The subclass guards (one shared ``__tensor_flatten__`` answer) still tell inputs
    apart: each change of dtype, shape, strides or requires_grad compiles again, and a
    repeat of an earlier input reuses its graph."""
    graphs = []

    def counting(gm, example_inputs, **kw):
        graphs.append(gm)
        return compile_backend.tpu_backend(gm, example_inputs, **kw)
    f = torch.compile(lambda t: t * 2, backend=counting, dynamic=False)
    base = torch.arange(6.0).reshape(2, 3)
    inputs = [base, base.to(torch.bfloat16), torch.arange(8.0).reshape(2, 4), base.t().contiguous().t()]
    for k, x in enumerate(inputs):
        out = f(x.to("tpu"))
        assert len(graphs) == k + 1
        torch.testing.assert_close(out.cpu(), x * 2)
    f(base.to("tpu"))                          # seen before: no new graph
    assert len(graphs) == len(inputs)
    w = base.to("tpu").requires_grad_()
    out = f(w)                                 # requires_grad: a training graph
    assert len(graphs) == len(inputs) + 1
    out.sum().backward()
    torch.testing.assert_close(w.grad.cpu(), torch.full((2, 3), 2.0))


def test_the_current_stream_dynamo_asks_for_before_each_graph_is_not_traced():
    """Dynamo's bytecode asks ``torch.accelerator.current_stream`` before every compiled
    graph: the tpu answer is skipped by Dynamo (no frame of its own compiled) and right,
    inside ``torch.tpu.stream`` too."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    torch._dynamo.utils.counters.clear()
    f = torch.compile(lambda t: t + 1, backend="tpu")
    x = torch.ones(3, device="tpu")
    s = torch.tpu.Stream()
    with torch.no_grad():
        f(x)
        with torch.tpu.stream(s):
            out = f(x)
            assert torch.accelerator.current_stream(torch.device("tpu", 0)) is s
    torch.testing.assert_close(out.cpu(), torch.full((3,), 2.0))
    assert torch._dynamo.utils.counters["frames"]["total"] == 1
    assert _debug_get_cache_entry_list(torch.accelerator.current_stream.__code__) == []
    assert torch.accelerator.current_stream(torch.device("tpu", 0)) is torch.tpu.current_stream()
