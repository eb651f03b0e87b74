"""A compiled training graph run through compile_train_fast_path's autograd.Function
keeps autograd's semantics: results and gradients match CPU and AOTAutograd's own path,
outputs that need no gradient, backward through one of several outputs, retain_graph,
version checks of saved inputs, activations passed to the backward without tensors (small
ones in one buffer per dtype), grad mode off at call time, no double backward; graphs
it does not fit keep AOTAutograd's wrappers, with the reason logged."""
from __future__ import annotations

import copy
import logging

import pytest
import torch

import tpu_kernels  # noqa: F401
from tpu_kernels import compile_backend, compile_train_fast_path

FAST = "tpu_kernels.compile_train_fast_path"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fast_off(monkeypatch):
    monkeypatch.setattr(compile_train_fast_path, "ON", False)


def _compile(fn):
    """``fn`` compiled with the tpu backend, and the list of what it handed Dynamo."""
    handed = []

    def probe(gm, example_inputs, **kw):
        handed.append(compile_backend.tpu_backend(gm, example_inputs, **kw))
        return handed[-1]
    return torch.compile(fn, backend=probe), handed


def _is_fast(handed) -> bool:
    """Whether the backend handed Dynamo compile_train_fast_path's call."""
    handed = getattr(handed, "__wrapped__", handed)   # compile_fast_path.with_lifted's call
    return getattr(handed, "__self__", None) is not None and \
        handed.__self__.__qualname__.endswith("_Compiled")


def _mlp_grads(model, x):
    model.zero_grad()
    out = model(x)
    (out * out).sum().backward()
    return out, [p.grad for p in model.parameters()]


def test_mlp_training_matches_cpu_and_aotautograd(monkeypatch):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    want_out, want = _mlp_grads(cpu, x)
    tpu = copy.deepcopy(cpu).to("tpu")
    cm, handed = _compile(tpu)
    for _ in range(2):       # the second call runs the compiled programs, traced by the first
        out, grads = _mlp_grads(cm, x.to("tpu"))
        torch.testing.assert_close(out.cpu(), want_out, atol=1e-5, rtol=1e-5)
        for g, w in zip(grads, want):
            torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-5)
    assert len(handed) == 1 and _is_fast(handed[0])
    torch._dynamo.reset()
    monkeypatch.setattr(compile_train_fast_path, "ON", False)
    slow, handed = _compile(tpu)
    for _ in range(2):       # the same two calls: the second one runs recorded, as above
        out, grads_aot = _mlp_grads(slow, x.to("tpu"))
    assert not _is_fast(handed[0])
    for g, a in zip(grads, grads_aot):
        torch.testing.assert_close(g.cpu(), a.cpu(), atol=0, rtol=0)


def test_backward_through_one_of_several_outputs_and_one_without_grad():
    torch.manual_seed(0)
    w_cpu = torch.randn(4, 4, requires_grad=True)
    w = w_cpu.detach().to("tpu").requires_grad_()

    def f(x, w):
        y = x @ w
        return y, y.sum(), y.argmax(dim=1), (x * 2).detach()
    x = torch.randn(2, 4)
    cf, handed = _compile(f)
    got = cf(x.to("tpu"), w)
    want = f(x, w_cpu)
    assert _is_fast(handed[0])
    assert [o.requires_grad for o in got] == [True, True, False, False]
    got[1].backward()            # the first output's gradient is zeros
    want[1].backward()
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)
    torch.testing.assert_close(got[2].cpu(), want[2])
    torch.testing.assert_close(got[3].cpu(), want[3])
    w.grad = None
    w_cpu.grad = None
    got = cf(x.to("tpu"), w)
    want = f(x, w_cpu)
    torch.autograd.backward([got[0], got[1]], [torch.ones(2, 4, device="tpu"), torch.tensor(2.0, device="tpu")])
    torch.autograd.backward([want[0], want[1]], [torch.ones(2, 4), torch.tensor(2.0)])
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)


def test_a_gradient_laid_out_otherwise_than_traced():
    torch.manual_seed(0)
    w_cpu = torch.randn(4, 3, requires_grad=True)
    w = w_cpu.detach().to("tpu").requires_grad_()
    x, g = torch.randn(2, 4), torch.randn(3, 2)
    cf, handed = _compile(lambda x, w: x @ w)
    cf(x.to("tpu"), w).backward(g.to("tpu").t())     # a transposed (non-contiguous) gradient
    (x @ w_cpu).backward(g.t())
    assert _is_fast(handed[0])
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)


def test_a_view_of_an_intermediate_is_a_plain_output():
    w = torch.ones(6, device="tpu", requires_grad=True)
    cf, handed = _compile(lambda x, w: (x * w).view(2, 3))
    out = cf(torch.arange(6.0).to("tpu"), w)
    assert _is_fast(handed[0])
    out.mul_(2)        # allowed on a view of an intermediate eagerly, and on this output
    out.sum().backward()
    torch.testing.assert_close(out.cpu(), 2 * torch.arange(6.0).view(2, 3))
    torch.testing.assert_close(w.grad.cpu(), 2 * torch.arange(6.0))


def test_retain_graph_backs_twice_and_without_it_the_second_backward_raises():
    w = torch.ones(3, device="tpu", requires_grad=True)
    cf, handed = _compile(lambda x, w: (x * w).sum())
    loss = cf(torch.arange(3.0).to("tpu"), w)
    assert _is_fast(handed[0])
    loss.backward(retain_graph=True)
    loss.backward()
    torch.testing.assert_close(w.grad.cpu(), 2 * torch.arange(3.0))
    loss = cf(torch.arange(3.0).to("tpu"), w)
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_a_saved_input_changed_in_place_before_backward_raises():
    w = torch.ones(3, device="tpu", requires_grad=True)
    x = torch.arange(3.0).to("tpu")
    cf, handed = _compile(lambda x, w: (x * w).sum())
    loss = cf(x, w)
    assert _is_fast(handed[0])
    x.add_(1)          # x is saved for w's gradient, as eagerly
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_an_input_a_saved_view_reads_changed_in_place_before_backward_raises():
    w = torch.ones(3, 4, device="tpu", requires_grad=True)
    x = torch.ones(2, 4, device="tpu", requires_grad=True)
    cf, handed = _compile(lambda x, w: torch.nn.functional.linear(x, w).sum())
    loss = cf(x, w)
    assert _is_fast(handed[0])
    with torch.no_grad():
        w.add_(1)      # x's gradient reads w's transpose, a view of w: eagerly this raises
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_saved_activations_reach_the_backward_as_storages_not_tensors():
    from tpu_kernels.storage import Storage
    w = torch.ones(3, device="tpu", requires_grad=True)
    cf, handed = _compile(lambda x, w: (x * w).exp().sum())
    x = torch.arange(3.0).to("tpu")
    loss = cf(x, w)
    assert _is_fast(handed[0])
    node = loss.grad_fn        # the autograd.Function's node is its ctx
    assert [tuple(t.shape) for t in node.saved_tensors] == [(3,)]    # x, version-checked
    # (the entry at x's place is x's own storage: the backward takes x's tensor there)
    activations = [s for s in node.raw if type(s) is tuple and type(s[0]) is Storage
                   and s[0] is not x._tpu_storage]
    assert [s[1][0] for s in activations] == [(3,)]     # exp's result: (storage, geometry)
    loss.backward()
    torch.testing.assert_close(w.grad.cpu(), torch.arange(3.0) * torch.arange(3.0).exp())
    assert node.raw is None       # freed with the backward, as saved tensors are


def test_small_saved_activations_leave_the_forward_in_one_buffer(monkeypatch):
    """Small activations saved for the backward leave the forward program as views of one
    buffer per dtype (one output instead of one each); one that is also returned keeps its
    own storage. Values and gradients are those of the unpacked program and of CPU."""
    from tpu_kernels import graph_program

    def f(x, w):
        h = (x * w).exp()       # returned and saved: its own storage
        return h, (h.sin() * w).cos().sum(), (x + w).tanh().sum()

    def run(pack):
        monkeypatch.setattr(graph_program, "pack_saved", pack)
        torch._dynamo.reset()
        w = torch.linspace(0.1, 0.9, 6, device="tpu").requires_grad_()
        x = torch.arange(6.0).to("tpu")
        cf, handed = _compile(f)
        outs = cf(x, w)
        assert _is_fast(handed[0])
        inputs = (x._tpu_storage, w._tpu_storage)
        # the activations' sources (the raw entries at inputs' places are the inputs')
        saved = [s for s in outs[1].grad_fn.raw if type(s) is tuple and not any(s[0] is i for i in inputs)]
        (outs[1] + outs[2]).backward()
        return outs, w.grad, saved

    outs, grad, saved = run(graph_program.pack_saved)
    want_outs, want_grad, apart = run(lambda result, start, inputs: result)
    h = outs[0]._tpu_storage
    packed = [s for s in saved if s[0] is not h]
    assert len({id(s[0]) for s in packed}) == 1 < len(packed)     # one buffer, several views
    assert len(apart) == len(saved) and len({id(s[0]) for s in apart}) >= 3   # unpacked: apart
    assert any(s[0] is h for s in saved)                          # the returned one, apart
    for got, want in zip((*outs, grad), (*want_outs, want_grad)):
        torch.testing.assert_close(got.cpu(), want.cpu())
    x, w = torch.arange(6.0), torch.linspace(0.1, 0.9, 6).requires_grad_()
    cpu = f(x, w)
    (cpu[1] + cpu[2]).backward()
    torch.testing.assert_close(grad.cpu(), w.grad)


@pytest.mark.parametrize("fast", [True, False])
def test_saved_tensors_hooks_see_what_is_saved(monkeypatch, fast):
    monkeypatch.setattr(compile_train_fast_path, "ON", fast)
    w = torch.ones(3, device="tpu", requires_grad=True)
    cf, handed = _compile(lambda x, w: (x * w).exp().sum())
    packed = []

    def pack(t):
        packed.append(tuple(t.shape))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = cf(torch.arange(3.0).to("tpu"), w)
    loss.backward()
    assert _is_fast(handed[0]) == fast
    assert packed == [(3,), (3,)]      # x (for w's gradient) and exp's result
    torch.testing.assert_close(w.grad.cpu(), torch.arange(3.0) * torch.arange(3.0).exp())


def test_grad_mode_off_at_call_time_runs_the_inference_graph():
    w = torch.ones(3, device="tpu", requires_grad=True)
    cf, handed = _compile(lambda x, w: x * w)
    x = torch.arange(3.0).to("tpu")
    assert cf(x, w).requires_grad and _is_fast(handed[0])
    with torch.no_grad():
        out = cf(x, w)
    assert not out.requires_grad and len(handed) == 2    # Dynamo's grad-mode guard recompiled
    torch.testing.assert_close(out.cpu(), torch.arange(3.0))


def test_double_backward_raises_as_aotautograds_does():
    w = torch.ones(3, device="tpu", requires_grad=True)
    cf, handed = _compile(lambda x, w: (x * w * w).sum())
    loss = cf(torch.arange(3.0).to("tpu"), w)
    assert _is_fast(handed[0])
    (g,) = torch.autograd.grad(loss, w, create_graph=True)
    torch.testing.assert_close(g.cpu(), 2 * torch.arange(3.0))
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="does not currently support double backward"):
        g.sum().backward()


def test_graphs_it_does_not_fit_keep_aotautograd_with_the_reason_logged(caplog):
    w = torch.ones(6, device="tpu", requires_grad=True)
    x = torch.arange(6.0).to("tpu")
    with caplog.at_level(logging.DEBUG, logger=FAST):
        cf, handed = _compile(lambda x, w: (w.view(2, 3), x * w))   # a view of an input
        out = cf(x, w)
    assert not _is_fast(handed[0]) and "aliases" in caplog.text
    assert out[0]._base is w
    (out[0].sum() + out[1].sum()).backward()
    torch.testing.assert_close(w.grad.cpu(), torch.arange(6.0) + 1)
    torch._dynamo.reset()
    caplog.clear()


def test_an_input_requiring_grad_written_keeps_aotautograd(caplog):
    # AOTAutograd traces the written input's gradient as a plain tensor: TpuTensor's
    # __coerce_same_metadata_as_tangent__ hands it over as its shadow
    w = torch.ones(6, device="tpu", requires_grad=True)
    a_cpu = torch.arange(6.0, requires_grad=True)
    a = a_cpu.detach().to("tpu").requires_grad_()

    def doubles(x, w):        # an input that requires grad, written: autograd must see it
        x.mul_(2)
        return (x * w).sum()
    with caplog.at_level(logging.DEBUG, logger=FAST):
        cf, handed = _compile(doubles)
        cf(a * 1, w).backward()
    doubles(a_cpu * 1, torch.ones(6)).backward()
    assert not _is_fast(handed[0]) and "not a user output's" in caplog.text
    torch.testing.assert_close(a.grad.cpu(), a_cpu.grad)


def test_an_input_written_in_the_graph_is_written_and_its_version_bumped():
    w = torch.ones(6, device="tpu", requires_grad=True)
    x = torch.arange(6.0).to("tpu")
    y = torch.zeros(6, device="tpu")

    def mutates(x, w, y):
        y.add_(1)
        return (x * w).sum()
    cf, handed = _compile(mutates)
    version = y._version
    cf(x, w, y).backward()
    assert _is_fast(handed[0]) and y._version > version
    torch.testing.assert_close(y.cpu(), torch.ones(6))
    torch.testing.assert_close(w.grad.cpu(), torch.arange(6.0))


def test_batch_norm_training_matches_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    x = torch.randn(5, 4)
    tpu = copy.deepcopy(cpu).to("tpu")
    cm, handed = _compile(tpu)
    for _ in range(2):
        _, want = _mlp_grads(cpu, x)
        _, got = _mlp_grads(cm, x.to("tpu"))
    assert _is_fast(handed[0])
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-5)
    for b, c in zip(tpu.buffers(), cpu.buffers()):     # running mean, variance, batches seen
        torch.testing.assert_close(b.cpu(), c, atol=1e-6, rtol=1e-6)


def test_turned_off_keeps_aotautograd(fast_off):
    w = torch.ones(3, device="tpu", requires_grad=True)
    cf, handed = _compile(lambda x, w: (x * w).sum())
    cf(torch.arange(3.0).to("tpu"), w).backward()
    assert not _is_fast(handed[0])
    torch.testing.assert_close(w.grad.cpu(), torch.arange(3.0))
