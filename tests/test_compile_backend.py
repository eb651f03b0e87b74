"""torch.compile(backend="tpu"): whole graphs, one XLA program per forward and backward."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import tpu_kernels
from tpu_kernels import compile_backend, compile_joint, deferred_mode, registry
from tpu_kernels.models import CNN, GPT, GPTConfig, train


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def programs_since(n: int) -> list:
    return compile_backend.PROGRAMS[n:]


@pytest.mark.parametrize("make,batch,joint", [  # eager, deferred and compiled training vs CPU
    (lambda: GPT(GPTConfig()), lambda: (torch.randint(0, 256, (4, 33)),), True),
    # batch norm's forward writes its running statistics: no joint program (compile_joint.py)
    (CNN, lambda: (torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))), False),
], ids=["gpt", "cnn"])
def test_eager_deferred_and_compiled_training_match_cpu(make, batch, joint):
    torch.manual_seed(0)
    cpu = make()
    init = copy.deepcopy(cpu)
    data = batch()
    expected = torch.tensor(train(cpu, data, 10))
    tdata = tuple(t.to("tpu") for t in data)
    for mode in ["eager", "deferred", "compiled"]:
        start = len(compile_backend.PROGRAMS)
        recorded = deferred_mode.stats()["compiles"]
        got = torch.tensor(train(copy.deepcopy(init).to("tpu"), tdata, 10, **({mode: True} if mode != "eager" else {})))
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=lambda m: f"{mode}: {m}")
        if mode == "deferred":   # one program per stage (forward, backward, optimizer step),
            # the optimizer's first step (which creates its state) one of its own; later steps reuse them
            assert deferred_mode.stats()["compiles"] - recorded <= 4
    progs = programs_since(start)
    # one forward and one backward program, each traced once, run on the first steps; the
    # later steps' loss.backward() was computed with the forward, by one joint program
    assert len(progs) == 2, [len(p.gm.graph.nodes) for p in progs]
    ran = compile_joint.WARMUP if joint else 10
    assert all(p.traces == 1 and p.calls == ran for p in progs), [(p.traces, p.calls) for p in progs]
    if joint:
        assert (progs[0].joint.traces, progs[0].joint.calls) == (1, 10 - compile_joint.WARMUP)
    else:
        assert not hasattr(progs[0], "joint")


def test_forward_is_one_graph_without_breaks():
    torch.manual_seed(0)
    model = GPT(GPTConfig()).to("tpu")
    tokens = torch.randint(0, 256, (2, 17), device="tpu")
    explained = torch._dynamo.explain(model)(tokens)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_inference_graph_reads_parameters_in_place():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    model = copy.deepcopy(cpu).to("tpu").eval()
    arrays = [p._tpu_storage.array for p in model.parameters()]
    x = torch.randn(3, 8)
    compiled = torch.compile(model, backend="tpu")
    with torch.no_grad():
        for _ in range(3):
            out = compiled(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), cpu(x), atol=1e-6, rtol=1e-5)
    # parameters are read where they live: no copies, no new storages
    assert all(p._tpu_storage.array is a for p, a in zip(model.parameters(), arrays))
    prog = compile_backend.PROGRAMS[-1]
    assert prog.traces == 1 and prog.calls == 3


def test_mutations_write_back():
    def step(x, buf):
        buf.add_(x.sum(0))          # buffer update
        x.mul_(2)                   # in-place update of an input
        return (x + buf).relu()

    x, buf = torch.randn(4, 3), torch.zeros(3)
    tx, tbuf = x.to("tpu"), buf.to("tpu")
    out = torch.compile(step, backend="tpu")(tx, tbuf)
    expected = step(x, buf)
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(tx.cpu(), x)
    torch.testing.assert_close(tbuf.cpu(), buf)


def test_batch_norm_running_stats_update():
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(3)
    tbn = copy.deepcopy(bn).to("tpu")
    x = torch.randn(8, 3)
    compiled = torch.compile(tbn, backend="tpu")
    for _ in range(2):
        out = compiled(x.to("tpu"))
        expected = bn(x)
    torch.testing.assert_close(out.cpu(), expected.detach())
    torch.testing.assert_close(tbn.running_mean.cpu(), bn.running_mean)
    torch.testing.assert_close(tbn.running_var.cpu(), bn.running_var)
    assert tbn.num_batches_tracked.item() == 2


def test_graph_break_and_recompile_on_new_shape():
    def f(x):
        y = x.sin() * 2
        if y.sum().item() > 0:       # data-dependent control flow: a graph break
            return y + 1
        return y - 1

    compiled = torch.compile(f, backend="tpu")
    for shape in [(4,), (4,), (6, 2)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), f(x))


def test_random_ops_draw_fresh_values_per_call_and_follow_the_seed():
    f = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="tpu")
    x = torch.ones(64, device="tpu")
    torch.manual_seed(3)
    a, b = f(x).cpu(), f(x).cpu()
    assert not torch.equal(a, b)
    assert set(a.unique().tolist()) <= {0.0, 2.0}
    torch.manual_seed(3)
    assert torch.equal(f(x).cpu(), a)


def test_index_checks_are_raised_after_a_compiled_call():
    f = torch.compile(lambda x, i: x.index_select(0, i) * 2, backend="tpu")
    x = torch.randn(4, device="tpu")
    out = f(x, torch.tensor([9], device="tpu"))
    with pytest.raises(IndexError, match="index_select"):
        out.cpu()


def test_custom_ops_and_kernels_appear_inside_graphs():
    """The registry picks per node, as in eager: a Helion kernel, a Pallas kernel (interpret
    mode here) and a custom op all run inside the one compiled program."""
    def f(x, w, g, u):
        h = torch.ops.tpu_kernels.swiglu(g, u)
        return torch.softmax(x @ w, dim=-1), h

    x, w = torch.randn(8, 128), torch.randn(128, 128)
    g, u = torch.randn(8, 128), torch.randn(8, 128)
    start = len(compile_backend.PROGRAMS)
    with registry.interpret():
        out, h = torch.compile(f, backend="tpu")(*(t.to("tpu") for t in (x, w, g, u)))
    torch.testing.assert_close(out.cpu(), torch.softmax(x @ w, dim=-1), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(h.cpu(), F.silu(g) * u, atol=1e-5, rtol=1e-5)
    (prog,) = programs_since(start)
    assert ("aten.mm.default", "pallas") in prog.impls, prog.impls
    assert ("aten._softmax.default", "helion") in prog.impls, prog.impls
    assert ("tpu_kernels.swiglu.default", "helion") in prog.impls, prog.impls


def test_user_kernel_inside_a_graph():
    import jax

    @tpu_kernels.tpu_kernel("aten::gelu", name="test_compiled_gelu")
    def my_gelu(x, approximate="none"):
        return jax.nn.gelu(x, approximate=approximate == "tanh")

    try:
        x = torch.randn(16)
        start = len(compile_backend.PROGRAMS)
        out = torch.compile(lambda t: F.gelu(t) + 1, backend="tpu")(x.to("tpu"))
        torch.testing.assert_close(out.cpu(), F.gelu(x) + 1, atol=1e-6, rtol=1e-5)
        (prog,) = programs_since(start)
        assert ("aten.gelu.default", "user") in prog.impls, prog.impls
    finally:
        registry.unregister(my_gelu)
