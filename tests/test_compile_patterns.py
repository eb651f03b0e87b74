"""torch.compile(backend="tpu") the ways users write it (issue 17): compiled models with the
loss and backward outside, several outputs, gradients crossing between compiled and eager
code both ways, ``torch.tensor(data, device=...)`` inside compiled code, eager runs before
and after compiling, graph breaks, torch.compile's ``mode``/``options``, copies to the host and
effectful ops (linalg's error checks) inside compiled code. Every case
matches the same code on CPU."""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tpu_kernels import compile_backend, compile_train_fast_path, registry


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def close(got, want, **kw):
    torch.testing.assert_close(got.cpu() if isinstance(got, torch.Tensor) else got, want,
                               atol=kw.get("atol", 1e-5), rtol=kw.get("rtol", 1e-5))


def pair(module: nn.Module):
    """(cpu module, its tpu copy)."""
    torch.manual_seed(0)
    return module, copy.deepcopy(module).to("tpu")


def grads_close(tpu: nn.Module, cpu: nn.Module):
    for (name, a), b in zip(tpu.named_parameters(), cpu.parameters()):
        assert a.grad is not None, name
        close(a.grad, b.grad, atol=1e-5, rtol=1e-4)


LOSSES = {  # the loss and backward outside the compiled model, as in the usual loop
    "cross_entropy": lambda out, y: F.cross_entropy(out, y).backward(),
    "sum": lambda out, y: out.sum().backward(),
    "mse": lambda out, y: F.mse_loss(out, torch.ones_like(out)).backward(),
    "backward_with_gradient": lambda out, y: (out * 2).backward(torch.full_like(out, 0.5)),
}


@pytest.mark.parametrize("loss", list(LOSSES))
def test_compiled_model_with_eager_loss_and_backward(loss):
    torch.manual_seed(0)
    cpu, tpu = pair(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)))
    x, y = torch.randn(2, 8), torch.tensor([1, 3])
    compiled = torch.compile(tpu, backend="tpu")
    for _ in range(2):               # the second call reuses the graphs
        LOSSES[loss](compiled(x.to("tpu")), y.to("tpu"))
        LOSSES[loss](cpu(x), y)
    grads_close(tpu, cpu)


def test_several_outputs_backward_through_each():
    w0 = torch.randn(4, 4)
    f = lambda x, w: (x @ w, (x @ w).sum(), (x @ w).detach() * 3)  # noqa: E731
    cf = torch.compile(f, backend="tpu")
    x = torch.randn(2, 4)
    for pick in range(2):
        w, tw = w0.clone().requires_grad_(), w0.to("tpu").requires_grad_()
        out, tout = f(x, w), cf(x.to("tpu"), tw)
        for a, b in zip(tout, out):
            close(a.detach(), b.detach())
        assert not tout[2].requires_grad          # an output that needs no grad
        (out[pick].sum() if pick == 0 else out[pick]).backward()
        (tout[pick].sum() if pick == 0 else tout[pick]).backward()
        close(tw.grad, w.grad)


def test_retain_graph_and_two_backwards():
    w0 = torch.randn(4, 4)
    f = lambda x, w: torch.tanh(x @ w)  # noqa: E731
    cf = torch.compile(f, backend="tpu")
    x = torch.randn(3, 4)
    w, tw = w0.clone().requires_grad_(), w0.to("tpu").requires_grad_()
    out, tout = f(x, w), cf(x.to("tpu"), tw)
    out.sum().backward(retain_graph=True)
    tout.sum().backward(retain_graph=True)
    (out ** 2).sum().backward()
    (tout ** 2).sum().backward()
    close(tw.grad, w.grad)


def test_aliasing_outputs():
    def f(x, w):
        y = x * w
        return y, y.t(), x.view(-1), x[1:]   # a view of an intermediate and of the input

    cf = torch.compile(f, backend="tpu")
    x0, w0 = torch.randn(3, 4), torch.randn(3, 4)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    tx, tw = x0.to("tpu").requires_grad_(), w0.to("tpu").requires_grad_()
    out, tout = f(x, w), cf(tx, tw)
    for a, b in zip(tout, out):
        close(a.detach(), b.detach())
    sum(o.sum() * (i + 1) for i, o in enumerate(out)).backward()
    sum(o.sum() * (i + 1) for i, o in enumerate(tout)).backward()
    close(tx.grad, x.grad)
    close(tw.grad, w.grad)


def test_outputs_that_are_views_of_another_output_carry_its_gradient():
    """No input aliased, only outputs each other: the flattened graph's metadata calls them
    plain, and the views once came back detached (a backward through the view alone
    raised; through both, the view's share of the gradient was lost)."""
    def f(x, w):
        y = x @ w
        return y, y.view(-1), y[0]

    cf = torch.compile(f, backend="tpu")
    x0, w0 = torch.randn(3, 4), torch.randn(4, 4)
    for weights in ((0, 1, 0), (1, 2, 3)):
        w, tw = w0.clone().requires_grad_(), w0.to("tpu").requires_grad_()
        out, tout = f(x0, w), cf(x0.to("tpu"), tw)
        assert all(o.requires_grad for o in tout)
        sum(o.sum() * k for o, k in zip(out, weights)).backward()
        sum(o.sum() * k for o, k in zip(tout, weights)).backward()
        close(tw.grad, w.grad)


def test_outputs_that_are_views_of_one_intermediate():
    """AOTAutograd refuses "intermediate bases" for tensor subclasses (transformers'
    ProphetNet returns two slices of its logits): the backend returns the intermediate
    and drops it again, and the outputs stay views of one tensor."""
    def f(x, w):
        y = x @ w
        return y[0], y[1:]

    x0, w0 = torch.randn(3, 4), torch.randn(4, 4)
    w, tw = w0.clone().requires_grad_(), w0.to("tpu").requires_grad_()
    out, tout = f(x0, w), torch.compile(f, backend="tpu")(x0.to("tpu"), tw)
    assert len(tout) == 2 and tout[0]._base is not None and tout[0]._base is tout[1]._base
    (out[0].sum() + 2 * out[1].sum()).backward()
    (tout[0].sum() + 2 * tout[1].sum()).backward()
    close(tw.grad, w.grad)


def test_gradients_flow_from_eager_into_compiled_and_back():
    """eager layer -> compiled block -> eager layer: every parameter gets its gradient."""
    torch.manual_seed(0)
    cpu, tpu = pair(nn.Sequential(nn.Linear(6, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 2)))
    block = torch.compile(tpu[1], backend="tpu")
    x = torch.randn(5, 6)
    out = tpu[2](block(tpu[0](x.to("tpu"))))
    F.cross_entropy(out, torch.tensor([0, 1, 1, 0, 1], device="tpu")).backward()
    F.cross_entropy(cpu(x), torch.tensor([0, 1, 1, 0, 1])).backward()
    grads_close(tpu, cpu)


def test_assignment_through_a_constant_mask_trains_as_on_cpu():
    """``h[mask] = v`` with a mask made from numpy inside compiled training (wav2vec2's,
    HuBERT's and Data2VecAudio's SpecAugment, on by default in training): its gradient
    needs ``nonzero``, which a trace cannot size, so Dynamo runs that stretch eagerly, as
    it does on CPU. It failed the compile, and once split off the error crossed torch's
    autograd engine and ended the process (std::terminate)."""
    import numpy as np

    def f(x, w, v):
        h = x @ w
        mask = torch.tensor(np.random.RandomState(0).rand(2, 5) < 0.4, device=h.device)
        h[mask] = v.to(h.dtype)
        return (h * h).sum()

    torch.manual_seed(0)
    args = [torch.randn(2, 5, 8), torch.randn(8, 8, requires_grad=True), torch.randn(8, requires_grad=True)]
    want = f(*args)
    want.backward()
    targs = [a.detach().to("tpu").requires_grad_(a.requires_grad) for a in args]
    got = torch.compile(f, backend="tpu")(*targs)
    got.backward()
    close(got, want.detach(), atol=1e-4)
    for t, a in zip(targs[1:], args[1:]):
        close(t.grad, a.grad, atol=1e-4)


def test_graph_break_keeps_both_sides_valid():
    def f(x, w):
        h = torch.tanh(x @ w)
        scale = h.abs().max().item()        # a graph break
        return (h / scale).sum(), h

    x0, w0 = torch.randn(4, 4), torch.randn(4, 4)
    w, tw = w0.clone().requires_grad_(), w0.to("tpu").requires_grad_()
    explained = torch._dynamo.explain(f)(x0.to("tpu"), tw)
    assert explained.graph_break_count == 1, explained.break_reasons
    torch._dynamo.reset()
    cf = torch.compile(f, backend="tpu")
    (loss, h), (tloss, th) = f(x0, w), cf(x0.to("tpu"), tw)
    close(th.detach(), h.detach())
    loss.backward()
    tloss.backward()
    close(tw.grad, w.grad)
    close(th.detach() * 2, h.detach() * 2)    # still readable after backward


@pytest.mark.parametrize("make", [
    lambda x: torch.cat([torch.tensor([], dtype=x.dtype, device=x.device), x]),
    lambda x: x + torch.tensor([1.0, 2.0, 3.0], device=x.device),
    lambda x: x * torch.tensor(2.5, device=x.device),
    lambda x: torch.where(x > 0, x, torch.tensor([-1.0], device=x.device)),
    lambda x: x[torch.tensor([2, 0], device=x.device)],
    # a small CPU constant moved with .to (transformers' sliding-window caches): fake
    # tensors folded the move into a constant they could not keep
    lambda x: x + torch.tensor(4, dtype=torch.long).to(x.device),
    lambda x: x * torch.arange(3).to(x.device) + torch.tensor([0.5, 1.0, 2.0]).to(x.device, torch.float32),
], ids=["empty_cat", "vector", "scalar", "one_element", "index", "moved_scalar", "moved_vectors"])
def test_tensor_from_data_inside_compiled_code(make):
    x = torch.randn(3)
    cf = torch.compile(make, backend="tpu")
    for _ in range(2):
        close(cf(x.to("tpu")), make(x))


_EXPLAIN_MOVED_CONSTANT = """
import sys, torch, tpu_kernels
f = lambda x: x + torch.tensor(4, dtype=torch.long).to(x.device)
explained = torch._dynamo.explain(f)(torch.randn(3, device="tpu"))
assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
assert "tpu_kernels.compile_backend" not in sys.modules
"""


def test_explain_traces_a_constant_moved_to_tpu():
    """``torch._dynamo.explain`` (its own backend: the tpu backend never loads) of code that
    moves a CPU constant to tpu, as Mistral's sliding-window cache does: fake tensors must
    trace the move for any backend, not only once the tpu backend is loaded. A fresh process."""
    out = subprocess.run([sys.executable, "-c", _EXPLAIN_MOVED_CONSTANT], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_float32_grouped_mm_trains_compiled():
    """MoE experts through ``F.grouped_mm`` in float32 (Qwen3-MoE's default experts): torch's
    own meta function refuses anything but bf16 under FakeTensor; CPU torch and tpu run it."""
    torch.manual_seed(0)
    a, b = torch.randn(16, 8, requires_grad=True), torch.randn(3, 8, 4, requires_grad=True)
    offs = torch.tensor([4, 4, 16], dtype=torch.int32)        # an empty group
    ta, tb = (t.detach().to("tpu").requires_grad_() for t in (a, b))
    f = lambda x, w, o: torch._grouped_mm(x, w, o).square().sum()  # noqa: E731
    torch.compile(f, backend="tpu")(ta, tb, offs.to("tpu")).backward()
    f(a, b, offs).backward()
    close(ta.grad, a.grad, atol=1e-4, rtol=1e-5)
    close(tb.grad, b.grad, atol=1e-4, rtol=1e-5)


def test_eager_then_compile_and_compile_then_eager():
    """A view after the attention output's transpose: eager runs first cached a result
    layout the graph must not take."""
    tf = pytest.importorskip("transformers")
    cfg = tf.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    cpu, tpu = pair(tf.LlamaForCausalLM(cfg).eval())
    ids = torch.randint(0, 128, (2, 16))
    want = cpu(ids).logits.detach()
    with torch.no_grad():
        close(tpu(ids.to("tpu")).logits, want, atol=1e-5, rtol=1e-4)
        compiled = torch.compile(tpu, backend="tpu")
        close(compiled(ids.to("tpu")).logits, want, atol=1e-5, rtol=1e-4)
        close(tpu(ids.to("tpu")).logits, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_modes_are_accepted(mode):
    x = torch.randn(8, 8)
    cf = torch.compile(lambda a: torch.relu(a @ a), backend="tpu", mode=mode)
    close(cf(x.to("tpu")), torch.relu(x @ x))


def test_options_and_their_errors():
    x = torch.randn(8, 8)
    f = lambda a: torch.softmax(a, -1) * 2  # noqa: E731
    # inductor's options are accepted (they do nothing here)
    cf = torch.compile(f, backend="tpu", options={"triton.cudagraphs": True, "epilogue_fusion": False})
    close(cf(x.to("tpu")), f(x))
    torch._dynamo.reset()
    start = len(compile_backend.PROGRAMS)
    cf = torch.compile(f, backend="tpu", options={"interpret": True})
    close(cf(x.to("tpu")), f(x))
    (prog,) = compile_backend.PROGRAMS[start:]
    assert ("aten._softmax.default", "helion") in prog.impls, prog.impls
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Unexpected optimization option.*'nope'.*interpret"):
        torch.compile(f, backend="tpu", options={"nope": 1})(x.to("tpu"))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Unrecognized mode=fastest"):
        torch.compile(f, backend="tpu", mode="fastest")(x.to("tpu"))


def test_registry_settings_are_part_of_the_program_key():
    """A call under other registry switches traces again; back under the first switches,
    the first program is reused."""
    x = torch.randn(8, 8)
    f = lambda a: torch.softmax(a, -1)  # noqa: E731
    cf = torch.compile(f, backend="tpu")
    start = len(compile_backend.PROGRAMS)
    close(cf(x.to("tpu")), f(x))
    (prog,) = compile_backend.PROGRAMS[start:]
    assert all(kind != "helion" for _, kind in prog.impls), prog.impls
    with registry.interpret():
        close(cf(x.to("tpu")), f(x))
    assert ("aten._softmax.default", "helion") in prog.impls, prog.impls
    close(cf(x.to("tpu")), f(x))
    assert prog.traces == 2 and prog.calls == 3


class _ScaledNorm(nn.Module):
    """Python float attributes, as an RMSNorm's eps: under ``dynamic=True`` Dynamo passes
    them as SymFloats, a float64 scalar the graph converts (``prims.convert_element_type``)."""

    def __init__(self) -> None:
        super().__init__()
        self.eps, self.scale = 1e-6, 0.5

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


def test_dynamic_shapes_and_python_floats():
    """``torch.compile(..., dynamic=True)``: one Dynamo graph for every size and every value
    of a Python float argument, matching CPU (an XLA program has static shapes, so the
    graph is traced once per size it meets, and not again per float value)."""
    m = _ScaledNorm()
    cm = torch.compile(m, backend="tpu", dynamic=True)
    start = len(compile_backend.PROGRAMS)
    for n in (3, 5, 3):
        x = torch.randn(n, 8)
        close(cm(x.to("tpu")), m(x))
    (prog,) = compile_backend.PROGRAMS[start:]
    assert prog.traces == 2 and prog.calls == 3
    f = lambda x, s: x * s + 1.5  # noqa: E731
    cf = torch.compile(f, backend="tpu", dynamic=True)
    start = len(compile_backend.PROGRAMS)
    for s in (0.5, 2.0, -3.25):
        x = torch.randn(4)
        close(cf(x.to("tpu"), s), f(x, s))
    (prog,) = compile_backend.PROGRAMS[start:]
    assert prog.traces == 1 and prog.calls == 3


def test_new_sizes_reuse_the_dynamic_graph():
    """Default ``torch.compile``: a second size recompiles with dynamic sizes (Dynamo's
    automatic dynamic shapes) and later sizes reuse that graph. This library's own ops (the
    fused cross entropy here) give symbolic result sizes; a fake impl that fixed each size
    recompiled per size until Dynamo's recompile limit left the function to run eagerly."""
    cpu, tpu = pair(nn.Linear(8, 5))
    f = lambda m, x, y: F.cross_entropy(m(x), y)  # noqa: E731
    cf = torch.compile(f, backend="tpu")
    start = len(compile_backend.PROGRAMS)
    for n in (3, 4, 5, 6):
        x, y = torch.randn(n, 8), torch.randint(0, 5, (n,))
        got, want = cf(tpu, x.to("tpu"), y.to("tpu")), f(cpu, x, y)
        close(got, want)
        got.backward()
        want.backward()
        grads_close(tpu, cpu)
    programs = compile_backend.PROGRAMS[start:]
    assert [(p.role, p.traces) for p in programs] == [("forward", 1), ("backward", 1), ("forward", 3), ("backward", 3)]
    assert any(op == "tpu_kernels.cross_entropy.default" for op, _ in programs[2].impls), programs[2].impls


@pytest.mark.parametrize("view", [
    pytest.param(lambda m: m[:-1], id="[:-1]"), pytest.param(lambda m: m[1:], id="[1:]"),
    pytest.param(lambda m: m[::2], id="[::2]"), pytest.param(lambda m: m.narrow(0, 0, 2), id="narrow"),
])
def test_eager_slices_of_outputs_fed_back_as_they_grow(view):
    """A cache carried between compiled calls and sliced eagerly in between (XLNet's
    ``generate`` trims its ``mems`` so), each call with a new size: the third call
    recompiles with dynamic sizes, and Dynamo must make a fake of an input that is a view.
    For tensor subclasses torch replays the view's slice with its bounds as symbols it
    cannot bind ("we only expect to bind basic symbols ... s12 + s60"); a tpu view is
    remade as one as_strided over its base instead. Values and gradients match CPU."""
    def step(x, mems):
        h = torch.cat([mems * 2, x], 0) if mems is not None else x
        return h.sum(0), h

    def run(device, backend):
        torch._dynamo.reset()
        torch.manual_seed(0)
        w = torch.randn(4).to(device).requires_grad_()
        cf, mems, outs = torch.compile(step, backend=backend), None, []
        for n in (2, 3, 4, 5):
            out, mems = cf(torch.randn(n, 4).to(device) * w, mems)
            mems = view(mems)
            outs.append(out)
        (sum(o.sum() for o in outs) + mems.sum()).backward()
        return [o.detach().cpu() for o in outs] + [mems.detach().cpu(), w.grad.cpu()]

    for got, want in zip(run("tpu", "tpu"), run("cpu", "aot_eager")):
        close(got, want)


@pytest.mark.parametrize("fast", [True, False], ids=["fast_path", "aot_path"])
def test_gradients_contiguous_with_other_strides_reach_the_backward(fast, monkeypatch):
    """A gradient torch counts as contiguous whose strides differ from the output's: ``g.t()``
    of shape (4, 1), and zero-size ones (a zero-width cache carried across a recompile with
    dynamic sizes). On AOTAutograd's own runtime path it restrides the shadow inside, which
    made a tpu tensor where it expects a plain one ('expected SubclassCreationMeta, got
    PlainTensorMeta'). Values and gradients match CPU, on both runtime paths."""
    monkeypatch.setattr(compile_train_fast_path, "ON", fast)

    def run(device, backend):
        torch._dynamo.reset()
        torch.manual_seed(0)
        x = torch.randn(4, 3).to(device).requires_grad_()
        w = torch.randn(3, 1).to(device)
        torch.compile(lambda x: x @ w, backend=backend)(x).backward(torch.arange(4.).reshape(1, 4).to(device).t())
        f = torch.compile(lambda z, m: (h := torch.cat([m * 2, z]), h.sum(0))[::-1], backend=backend)
        outs = []
        for n in (2, 3, 4):
            z, m = (torch.randn(n, 0).to(device).requires_grad_() for _ in range(2))
            outs += [*f(z, m)]
            sum(o.sum() for o in outs[-2:]).backward()
            outs += [z.grad, m.grad]
        return [x.grad] + [o.detach().cpu() for o in outs]

    for got, want in zip(run("tpu", "tpu"), run("cpu", "aot_eager")):
        close(got, want)


def test_activation_checkpointing_recomputes_the_same_dropout():
    """``torch.utils.checkpoint`` in a compiled function: the backward program recomputes
    the region, and its dropout draws the mask the forward drew (AOTAutograd wraps the two
    in ``run_and_save_rng_state`` / ``run_with_rng_state``)."""
    from torch.utils.checkpoint import checkpoint
    w = torch.randn(64)
    wt = w.to("tpu")
    f = torch.compile(lambda x: checkpoint(lambda t: F.dropout(t, 0.5) * wt, x, use_reentrant=False),
                      backend="tpu")
    start = len(compile_backend.PROGRAMS)
    x = torch.randn(8, 64).to("tpu").requires_grad_()
    y = f(x)
    y.sum().backward()
    forward, backward = compile_backend.PROGRAMS[start:]
    assert any(n.target is torch.ops.higher_order.run_with_rng_state for n in backward.gm.graph.nodes)
    kept = y.detach().cpu() != 0
    assert 0.3 < kept.float().mean() < 0.7
    close(x.grad, torch.where(kept, 2 * w.expand(8, 64), 0.0))


def test_rng_state_hops_op_by_op():
    """The same two ops run eagerly (a graph run op by op): the saved state replays the
    draw, and the generator goes on from where the first draw left it."""
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
    x = torch.full((256,), 0.5, device="tpu")
    state, first = run_and_save_rng_state(torch.ops.aten.bernoulli.default, x)
    assert state.device.type == "tpu" and state.dtype == torch.uint8
    again = run_with_rng_state(state.cpu(), torch.ops.aten.bernoulli.default, x)
    after = torch.bernoulli(x)
    close(again, first.cpu())
    assert not torch.equal(after.cpu(), first.cpu())


@pytest.mark.parametrize("draw", [
    pytest.param(lambda: torch.rand([]), id="rand"),
    pytest.param(lambda: torch.randperm(8), id="randperm"),
    pytest.param(lambda: torch.randint(0, 10, (5,)), id="randint"),
    pytest.param(lambda: torch.empty(6).bernoulli_(0.5), id="bernoulli_"),
    pytest.param(lambda: F.dropout(torch.ones(8), 0.5, training=True), id="dropout"),
    pytest.param(lambda: torch.multinomial(torch.ones(5), 3), id="multinomial"),
])
def test_random_ops_on_the_cpu_draw_anew_every_call(draw):
    """A random op making a CPU tensor inside compiled code (a layer drop's
    ``torch.rand([]) < p``, M2M100's and NLLB's) draws anew on every call, from the
    program's key, and its result is still a CPU tensor of the eager dtype and shape. It
    ran as a plain CPU op while the program was traced, so every call returned that one
    draw: a layer drop decided once for all of training."""
    x = torch.randn(3, device="tpu")
    cf = torch.compile(lambda x: (x * 2, draw()), backend="tpu")
    torch.manual_seed(0)
    draws = [cf(x)[1] for _ in range(6)]
    want = draw()
    assert all(d.device.type == "cpu" and d.dtype == want.dtype and d.shape == want.shape for d in draws)
    assert len({tuple(d.flatten().tolist()) for d in draws}) > 1, draws
    torch.manual_seed(0)
    close(cf(x)[1], draws[0], atol=0, rtol=0)      # torch.manual_seed replays them
    if want.dtype == torch.int64:                  # each draw is one torch's op can give
        assert all(0 <= int(d.min()) and int(d.max()) < 10 for d in draws)


def test_compiled_under_inference_mode():
    """A compiled model called under ``torch.inference_mode()`` (an evaluation loop): a
    padding mask cast with ``.to(bool)`` and views of the parameters, matching CPU."""
    cpu, tpu = pair(nn.Linear(8, 8))

    def f(m, x, mask):
        h = m(x).masked_fill(~mask.to(torch.bool)[..., None], 0.0)
        return h.transpose(0, 1).reshape(-1, 8) @ m.weight.t()
    cf = torch.compile(f, backend="tpu")
    x, mask = torch.randn(2, 5, 8), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    with torch.inference_mode():
        close(cf(tpu, x.to("tpu"), mask.to("tpu")), f(cpu, x, mask))


@pytest.mark.parametrize("compiled_autograd", [False, True])
def test_a_whole_training_step_compiled(compiled_autograd, caplog):
    """``torch.compile(step)`` where the step runs the forward, ``loss.backward()``,
    ``clip_grad_norm_`` and ``opt.step()``: Dynamo breaks the graph at the backward, and
    the compiled graph's backward that the autograd engine then calls runs as it is
    (Dynamo must not compile its frame). Three steps match CPU. With
    ``torch._dynamo.config.compiled_autograd`` on (torch's way to capture the backward
    too), which cannot capture tpu tensors, the step runs as without it, said once in the
    log (it raised an error from inside Dynamo's tracing of the tpu tensor class)."""
    from tpu_kernels.device import _say_compiled_autograd_ignored
    _say_compiled_autograd_ignored.cache_clear()
    with torch._dynamo.config.patch(compiled_autograd=compiled_autograd), \
            caplog.at_level("WARNING", logger="tpu_kernels.device"):
        _train_whole_step_compiled()
    said = [r for r in caplog.records if "compiled autograd cannot capture" in r.getMessage()]
    assert len(said) == int(compiled_autograd)


def _train_whole_step_compiled() -> None:
    cpu, tpu = pair(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)))

    def step(m, opt, x, y):
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        return loss
    opt_cpu, opt_tpu = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, tpu))
    compiled = torch.compile(step, backend="tpu")
    for _ in range(3):
        x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
        close(compiled(tpu, opt_tpu, x.to("tpu"), y.to("tpu")), step(cpu, opt_cpu, x, y), atol=1e-5, rtol=1e-4)
    for a, b in zip(tpu.parameters(), cpu.parameters()):
        close(a.detach(), b.detach(), atol=1e-5, rtol=1e-4)


@torch.compiler.disable(recursive=False)
def _eager_full(n: int, device: torch.device) -> torch.Tensor:
    return torch.full((n,), 2.0, device=device)


def test_factory_op_run_eagerly_inside_compiled_code():
    """A frame Dynamo skips but whose calls it still compiles (``recursive=False``, as
    ``nn.Transformer``'s mask helpers are reached after a graph break) makes a tpu tensor
    with a factory op: the factory's kernel runs the runtime outside Dynamo (it used to
    compile the runtime's and JAX's frames, and failed inside ``jnp.full``)."""
    x = torch.randn(4)
    f = lambda t: t + _eager_full(t.shape[0], t.device)  # noqa: E731
    close(torch.compile(f, backend="tpu")(x.to("tpu")), x + 2)


def test_compiled_nn_transformer_trains_over_two_lengths():
    """``nn.Transformer`` compiled: its causal-mask check (``.item()``) breaks the graph, so
    the attention's fused composite kernel (caught at ``AutogradPrivateUse1``) runs in the
    eager stretch, called by torch from C++. Dynamo used to compile that kernel as a frame
    of its own and, once automatic dynamic shapes made it symbolic, failed building its
    guards (a symbol of a tpu view's replay); the kernel is now never traced."""
    torch.manual_seed(0)
    cpu = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                         dim_feedforward=32, dropout=0.0, batch_first=True)
    tpu = copy.deepcopy(cpu).to("tpu")
    cm = torch.compile(tpu, backend="tpu")
    for s, t in ((6, 5), (7, 4)):
        src, tgt = torch.randn(2, s, 16), torch.randn(2, t, 16)
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        got = cm(src.to("tpu"), tgt.to("tpu"), tgt_mask=mask.to("tpu"))
        want = cpu(src, tgt, tgt_mask=mask)
        close(got, want)
        got.sum().backward()
        want.sum().backward()
        grads_close(tpu, cpu)


@pytest.mark.parametrize("fn", [
    lambda x, w: (x @ w).cpu() * 2,                                   # a result brought to the host
    lambda x, w: ((x @ w).to("cpu") * 3).to("tpu").relu().sum(),      # to the host and back
    lambda x, w: ((x @ w).relu().cpu() ** 2).sum(),                   # a host loss
], ids=["cpu result", "there and back", "host loss"])
def test_copies_to_the_host_inside_compiled_code(fn):
    """``.cpu()`` inside a compiled function: inside the program a CPU tensor is a value
    like any other, and torch gets the graph's CPU results on the CPU; gradients flow back."""
    torch.manual_seed(0)
    w_cpu, x = torch.randn(4, 3, requires_grad=True), torch.randn(2, 4)
    w = w_cpu.detach().to("tpu").requires_grad_()
    got, want = torch.compile(fn, backend="tpu")(x.to("tpu"), w), fn(x, w_cpu)
    assert got.device == want.device
    close(got.detach(), want.detach().cpu())
    got.sum().backward()
    want.sum().backward()
    close(w.grad, w_cpu.grad)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("fn", [
    lambda a, b: torch.linalg.solve(a, b),
    lambda a, b: torch.linalg.cholesky(a) @ b,
    lambda a, b: torch.linalg.inv(a) @ b,
], ids=["solve", "cholesky", "inv"])
def test_linalg_with_its_error_check_compiled(fn, grad):
    """torch.linalg's solvers check their ``info`` through an effectful op
    (``_linalg_check_errors``), which AOTAutograd threads with effect tokens (``None`` at
    run time) through ``with_effects``: the compiled program runs it like any other op."""
    torch.manual_seed(0)
    m = torch.randn(4, 4)
    a_cpu, b = (m @ m.T + 4 * torch.eye(4)).requires_grad_(grad), torch.randn(4, 2)
    a = a_cpu.detach().to("tpu").requires_grad_(grad)
    got, want = torch.compile(fn, backend="tpu")(a, b.to("tpu")), fn(a_cpu, b)
    close(got.detach(), want.detach(), atol=1e-4, rtol=1e-4)
    if grad:
        got.abs().sum().backward()
        want.abs().sum().backward()
        close(a.grad, a_cpu.grad, atol=1e-4, rtol=1e-4)


def test_attention_whose_values_are_narrower_than_its_keys_trains_compiled():
    """DeepSeek-V2/V3, MiniCPM3 and GLM-4-MoE-Lite attend with value heads narrower than
    query/key heads: SDPA becomes _scaled_dot_product_fused_attention_overrideable, whose
    max_q/max_k results are numbers; inside a compiled program they were read off traced
    arrays (ConcretizationTypeError). They are torch's meta numbers there."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 8, 12), torch.randn(2, 4, 8, 12), torch.randn(2, 4, 8, 6)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    tpu = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    want, got = f(*cpu), torch.compile(f, backend="tpu")(*tpu)
    want.square().sum().backward()
    got.square().sum().backward()
    close(got, want)
    for a, b in zip(tpu, cpu):
        close(a.grad, b.grad, atol=1e-5, rtol=1e-4)


def test_a_module_cast_to_its_own_dtype_inside_compiled_code():
    """SwitchTransformers' router runs ``self.classifier = self.classifier.to(self.dtype)``
    in its forward: a conversion that changes nothing, which torch still did by swapping each
    parameter with itself, refused for parameters Dynamo holds weakly ("Couldn't swap")."""
    class Router(nn.Module):
        def __init__(self):
            super().__init__()
            self.classifier = nn.Linear(4, 3)

        def forward(self, x):
            self.classifier = self.classifier.to(torch.float32)
            return self.classifier(x).softmax(-1)
    cpu, tpu = pair(Router())
    x = torch.randn(5, 4)
    cf = torch.compile(tpu, backend="tpu")
    for _ in range(2):
        cf(x.to("tpu")).square().sum().backward()
        cpu(x).square().sum().backward()
    grads_close(tpu, cpu)


def test_an_op_failing_while_the_backward_is_traced_raises_and_the_process_lives():
    """torch's decomposition of mse_loss_backward divides by numel(): compiling the mean loss
    of an empty batch fails in torch itself (aot_eager on CPU raises ZeroDivisionError). On
    tpu the error went through a C++ autograd node whose stream guard, unwinding, called the
    Python device guard with the error still set: std::terminate killed the process. It is
    raised by the compile now."""
    a, b = torch.randn(0, 5, device="tpu", requires_grad=True), torch.randn(0, 5, device="tpu")
    with pytest.raises(Exception, match="mse_loss_backward.*ZeroDivisionError"):
        torch.compile(lambda a, b: F.mse_loss(a, b), backend="tpu")(a, b)
    x = torch.randn(3, device="tpu", requires_grad=True)   # later compiles and ops work
    torch.compile(lambda x: (x * 2).sum(), backend="tpu")(x).backward()
    close(x.grad, torch.full((3,), 2.0))
