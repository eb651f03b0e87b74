"""torch.tpu.graph / TPUGraph: a captured step replays as one executable, with
torch.cuda.graph's contract (memory read at replay, nothing run at capture)."""
from __future__ import annotations

import copy

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import tpu_kernels  # noqa: F401  (registers the tpu device)
from tpu_kernels import aot, graph_packing, lazy
from tpu_kernels.models import GPT, GPTConfig
from tpu_kernels.graphs import TPUGraph


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _step(model, opt, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def _warmed_pair(x, y):
    """An MLP on CPU and its copy on tpu (capturable AdamW), each one step in, so the
    optimizer's state exists before a capture; the tpu side's grads set to None."""
    cpu = _mlp()
    tpu = copy.deepcopy(cpu).to("tpu")
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_t = torch.optim.AdamW(tpu.parameters(), lr=1e-2, capturable=True)
    _step(cpu, opt_c, x, y)
    _step(tpu, opt_t, x.to("tpu"), y.to("tpu"))
    opt_t.zero_grad(set_to_none=True)
    return cpu, tpu, opt_c, opt_t


def test_a_captured_training_step_replays_as_cpu_steps():
    batches = [(torch.randn(5, 8), torch.randn(5, 4)) for _ in range(5)]
    cpu, tpu, opt_c, opt_t = _warmed_pair(*batches[0])
    sx, sy = torch.zeros(5, 8, device="tpu"), torch.zeros(5, 4, device="tpu")
    before = [p.cpu() for p in tpu.parameters()]
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        loss = _step(tpu, opt_t, sx, sy)
    # nothing ran: parameters as before, the block's outputs zero until the first replay
    assert all(torch.equal(b, p.cpu()) for b, p in zip(before, tpu.parameters()))
    assert loss.item() == 0.0
    for x, y in batches[1:]:
        sx.copy_(x.to("tpu"))
        sy.copy_(y.to("tpu"))
        g.replay()
        opt_c.zero_grad(set_to_none=True)
        ref = _step(cpu, opt_c, x, y)
        torch.testing.assert_close(loss.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-6)
    for p, q in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


def test_replay_reads_memory_written_outside_and_writes_in_place():
    a = torch.arange(4.0, device="tpu")
    acc = torch.zeros(4, device="tpu")
    view = acc[1:3]
    g = TPUGraph()
    g.capture_begin()
    acc.add_(a * 2)
    g.capture_end()
    assert acc.tolist() == [0, 0, 0, 0]
    g.replay()
    g.replay()
    assert acc.tolist() == [0, 4, 8, 12]
    assert view.tolist() == [4, 8]                   # views see the storage's new value
    a.fill_(1.0)
    g.replay()
    assert acc.tolist() == [2, 6, 10, 14]


def test_replay_hands_written_inputs_to_the_program_without_copies(monkeypatch):
    # a written input held by nothing but its storage is donated as it is; the last one
    # read was copied at every replay (a loop variable held it), one launch a step more
    monkeypatch.setattr(graph_packing, "MAX_MEMBER_BYTES", 0)   # each its own array
    xs = [torch.arange(4.0, device="tpu") for _ in range(3)]   # (not a kept fill)
    g = TPUGraph()
    with torch.tpu.graph(g):
        for t in xs:
            t.add_(1.0)
    copies = []
    real = jnp.array
    monkeypatch.setattr(jnp, "array", lambda *a, **k: copies.append(1) or real(*a, **k))
    for _ in range(3):
        g.replay()
    assert not copies
    assert [t.tolist() for t in xs] == [[3.0, 4.0, 5.0, 6.0]] * 3
    kept = xs[0].jax()          # a value the user holds is not given away: copied
    g.replay()
    assert len(copies) == 1 and kept.tolist() == [3.0, 4.0, 5.0, 6.0] and xs[0].tolist() == [4.0, 5.0, 6.0, 7.0]


def test_state_read_and_written_travels_as_one_buffer_per_dtype(monkeypatch):
    ws = [torch.arange(4.0, device="tpu") + k for k in range(3)]
    n = torch.zeros((), dtype=torch.int64, device="tpu")
    big = torch.ones(2, device="tpu")
    monkeypatch.setattr(graph_packing, "MAX_MEMBER_BYTES", 16)    # big (8 bytes) packs too
    g = TPUGraph()
    with torch.tpu.graph(g):
        for w in ws:
            w.mul_(2.0)
        n.add_(1)
        big.add_(ws[0][:2])
    assert [len(p.storages) for p in g._packs] == [4]   # float32: ws and big; n alone stays
    calls = []
    real = graph_packing.Pack._pack_now
    monkeypatch.setattr(graph_packing.Pack, "_pack_now", lambda self: calls.append(1) or real(self))
    cuts = []
    real_fill = graph_packing.Pack.fill
    monkeypatch.setattr(graph_packing.Pack, "fill", lambda self, p: cuts.append(1) or real_fill(self, p))
    g.replay()                  # first replay: the members' values are packed (one dispatch)
    g.replay()                  # then the buffer goes round without being cut up
    g.replay()
    assert len(calls) == 1 and not cuts
    assert ws[1].tolist() == [8.0, 16.0, 24.0, 32.0] and n.item() == 3
    assert len(cuts) == 1       # reading one member cut them all out, once
    assert big.tolist() == [1.0, 15.0]       # + ws[0][:2] after its doubling: 2, 4 and 8
    ws[1].fill_(1.0)            # written between replays: the next packs the values anew
    g.replay()
    assert len(calls) == 2
    assert ws[1].tolist() == [2.0] * 4 and ws[0].tolist() == [0.0, 16.0, 32.0, 48.0]


def test_packed_state_reads_and_writes_between_replays_match_cpu():
    # what a training loop does between replays: log the loss, checkpoint (state_dict
    # reads every packed tensor), restore a checkpoint (load_state_dict writes them all)
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    cpu, tpu, opt_c, opt_t = _warmed_pair(x, y)
    sx, sy = x.to("tpu"), y.to("tpu")
    g = TPUGraph()
    with torch.tpu.graph(g):
        loss = _step(tpu, opt_t, sx, sy)
    assert g._packs and len(g._packs[0].storages) >= 3 * len(list(tpu.parameters()))
    saved = None
    for i in range(4):
        g.replay()
        opt_c.zero_grad(set_to_none=True)
        ref = _step(cpu, opt_c, x, y)
        torch.testing.assert_close(loss.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-6)
        state = {k: v.cpu() for k, v in tpu.state_dict().items()}
        for k, v in cpu.state_dict().items():
            torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-6)
        if i == 1:
            saved = (copy.deepcopy(cpu.state_dict()), copy.deepcopy(opt_c.state_dict()))
    tpu.load_state_dict(saved[0])        # parameters written in place between replays
    cpu.load_state_dict(saved[0])
    opt_c.load_state_dict(saved[1])
    for p_t, p_c in zip(tpu.parameters(), cpu.parameters()):   # the moments too
        for key in ("exp_avg", "exp_avg_sq"):
            opt_t.state[p_t][key].copy_(opt_c.state[p_c][key].to("tpu"))
        opt_t.state[p_t]["step"].copy_(opt_c.state[p_c]["step"].to("tpu"))
    g.replay()
    opt_c.zero_grad(set_to_none=True)
    ref = _step(cpu, opt_c, x, y)
    torch.testing.assert_close(loss.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-6)
    for p_t, p_c in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(p_t.detach().cpu(), p_c.detach(), rtol=1e-5, atol=1e-6)


def _fresh_grads_step(model, opt, x, y):
    """``_step`` with ``zero_grad(set_to_none=True)`` in it: the step makes its gradients anew."""
    opt.zero_grad(set_to_none=True)
    return _step(model, opt, x, y)


def _captured_fresh_grads_step(x, y):
    """``_warmed_pair`` and ``_fresh_grads_step`` of its tpu side captured on (x, y):
    (cpu, tpu, opt_c, the tpu input x, the graph, the captured loss)."""
    cpu, tpu, opt_c, opt_t = _warmed_pair(x, y)
    sx, sy = x.to("tpu"), y.to("tpu")
    g = TPUGraph()
    with torch.tpu.graph(g):
        loss = _fresh_grads_step(tpu, opt_t, sx, sy)
    return cpu, tpu, opt_c, sx, g, loss


def test_gradients_made_in_the_step_travel_as_one_result_buffer(monkeypatch):
    """A step with zero_grad(set_to_none) in it makes its gradients anew: written, never
    read, they come back as one buffer per dtype; reading them between replays (a norm
    logged eagerly, a clipping outside the step) gives CPU's values, and a read recorded
    in deferred mode before the next replay still sees its own step's gradients."""
    from tpu_kernels.deferred_mode import deferred
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    cpu, tpu, opt_c, _, g, loss = _captured_fresh_grads_step(x, y)
    results_only = [p for p in g._packs if not p.reads]
    packed = {id(st) for p in results_only for st in p.storages}
    assert all(id(p.grad._tpu_storage) in packed for p in tpu.parameters())
    cuts = []
    real_fill = graph_packing.Pack.fill
    monkeypatch.setattr(graph_packing.Pack, "fill", lambda self, p: cuts.append(1) or real_fill(self, p))
    for i in range(3):
        g.replay()
        ref = _fresh_grads_step(cpu, opt_c, x, y)
        torch.testing.assert_close(loss.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-6)
        if i == 1:
            with deferred():
                norms = [p.grad.norm() for p in tpu.parameters()]   # recorded, not run
                g.replay()                                           # the buffer is replaced
                ref_norms = [p.grad.norm() for p in cpu.parameters()]
                ref = _fresh_grads_step(cpu, opt_c, x, y)
            torch.testing.assert_close(torch.stack(norms).cpu(), torch.stack(ref_norms), rtol=1e-5, atol=1e-6)
        for p_t, p_c in zip(tpu.parameters(), cpu.parameters()):
            torch.testing.assert_close(p_t.grad.cpu(), p_c.grad, rtol=1e-5, atol=1e-6)
    assert cuts


def test_a_gradient_placeholder_held_past_the_next_replay_keeps_its_step():
    """A results-only pack's placeholder held beyond its storage (here taken by hand; in
    the runtime, any holder that has not read it yet) is cut out of its own replay's
    buffer when the next replay publishes a new one, so it still reads its own step."""
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    cpu, tpu, opt_c, sx, g, _ = _captured_fresh_grads_step(x, y)
    g.replay()
    _fresh_grads_step(cpu, opt_c, x, y)
    w = next(tpu.parameters())
    held = w.grad._tpu_storage.array
    assert isinstance(held, lazy.Lazy) and held.value is None   # not cut out yet
    first = next(cpu.parameters()).grad.clone()
    sx.mul_(2)                                                  # the next step differs
    g.replay()
    _fresh_grads_step(cpu, opt_c, x * 2, y)
    assert w.grad._tpu_storage.array is not held
    torch.testing.assert_close(torch.tensor(np.array(lazy.concrete(held))), first,
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad.cpu(), next(cpu.parameters()).grad, rtol=1e-5, atol=1e-6)


def test_random_ops_draw_fresh_values_each_replay():
    torch.manual_seed(0)
    out = torch.zeros(64, device="tpu")
    g = TPUGraph()
    with torch.tpu.graph(g):
        out.copy_(torch.nn.functional.dropout(torch.ones(64, device="tpu"), 0.5))
    g.replay()
    first = out.cpu()
    g.replay()
    second = out.cpu()
    assert set(first.unique().tolist()) <= {0.0, 2.0} and set(second.unique().tolist()) <= {0.0, 2.0}
    assert not torch.equal(first, second)
    torch.manual_seed(1)
    eager = torch.nn.functional.dropout(torch.ones(64, device="tpu"), 0.5).cpu()
    torch.manual_seed(1)
    g.replay()
    assert torch.equal(out.cpu(), eager)             # the draws an eager step would make


def test_a_value_read_during_capture_raises_and_leaves_eager_working():
    x = torch.ones(3, device="tpu")
    g = TPUGraph()
    with pytest.raises(lazy.CaptureError, match="captured"):
        with torch.tpu.graph(g):
            (x * 2).sum().item()
    assert not lazy.capturing()
    assert (x * 3).tolist() == [3, 3, 3]
    g.replay()                                       # a failed capture replays nothing
    assert x.tolist() == [1, 1, 1]


def test_an_optimizer_counting_on_the_host_is_refused():
    model = _mlp().to("tpu")
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(2, 8, device="tpu")
    with pytest.raises(RuntimeError, match="capturable=True"):
        with torch.tpu.graph(TPUGraph()):
            model(x).sum().backward()
            opt.step()
    assert not lazy.capturing()


def test_failed_index_checks_raise_after_replay():
    x = torch.arange(4.0, device="tpu")
    idx = torch.tensor([1], device="tpu")
    out = torch.zeros(1, device="tpu")
    g = TPUGraph()
    with torch.tpu.graph(g):
        out.copy_(x.index_select(0, idx))
    g.replay()
    assert out.tolist() == [1.0]
    idx.fill_(9)
    g.replay()
    with pytest.raises(IndexError, match="index_select"):
        torch.tpu.synchronize()


def test_storages_sharing_one_array_at_capture_stay_apart():
    base = torch.ones(2, 2, device="tpu")
    copy_ = torch.empty(2, 2, device="tpu")
    copy_._tpu_storage.array = base._tpu_storage.array     # two storages, one array
    same = torch.ones(2, 2, device="tpu")                  # (a kept constant fill: the same)
    out = torch.zeros(2, 2, device="tpu")
    g = TPUGraph()
    with torch.tpu.graph(g):
        out.copy_(copy_ + 1)
        same.mul_(3)
    g.replay()
    assert out.tolist() == [[2, 2], [2, 2]] and same.tolist() == [[3, 3], [3, 3]]
    base.fill_(5.0)              # another storage: the graph reads copy_'s
    copy_.fill_(7.0)
    g.replay()
    assert out.tolist() == [[8, 8], [8, 8]] and base.tolist() == [[5, 5], [5, 5]]
    assert same.tolist() == [[9, 9], [9, 9]] and torch.ones(2, 2, device="tpu").tolist() == [[1, 1], [1, 1]]


def test_capture_inside_a_capture_is_refused():
    g = TPUGraph()
    with torch.tpu.graph(g):
        with pytest.raises(RuntimeError, match="already open"):
            TPUGraph().capture_begin()
    assert torch.tpu.graph is not None and torch.tpu.TPUGraph is TPUGraph


def test_a_transformers_llama_training_step_captured_matches_cpu():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                   max_position_embeddings=32)
    cpu = transformers.LlamaForCausalLM(cfg).train()
    tpu = copy.deepcopy(cpu).to("tpu")
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-3)
    opt_t = torch.optim.AdamW(tpu.parameters(), lr=1e-3, capturable=True)
    ids = [torch.randint(0, 64, (2, 16)) for _ in range(4)]
    static = ids[0].to("tpu")

    def step(model, opt, x):
        opt.zero_grad(set_to_none=False)
        loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        return loss

    step(cpu, opt_c, ids[0])
    step(tpu, opt_t, static)
    g = TPUGraph()
    with torch.tpu.graph(g):
        loss = step(tpu, opt_t, static)
    for x in ids[1:]:
        static.copy_(x.to("tpu"))
        g.replay()
        torch.testing.assert_close(loss.detach().cpu(), step(cpu, opt_c, x).detach(), rtol=1e-5, atol=1e-5)
    for p, q in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)


def test_a_compiled_graph_inside_a_capture_is_refused():
    model = _mlp().to("tpu")
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(2, 8, device="tpu")
    compiled(x)
    with pytest.raises(RuntimeError, match="torch.compile'd graph ran inside a tpu graph capture"):
        with torch.tpu.graph(TPUGraph()):
            compiled(x)
    assert not lazy.capturing()
    torch.testing.assert_close(compiled(x).cpu(), model(x).cpu())


def test_host_data_copied_in_the_block_is_copied_again_at_each_replay():
    acc = torch.zeros(2, device="tpu")
    whole = torch.zeros(2, device="tpu")
    g = TPUGraph()
    with torch.tpu.graph(g):
        whole.copy_(torch.tensor([1.0, 2.0]))        # host data: read at capture
        acc.add_(whole * 2)
    assert whole.tolist() == [0, 0] and acc.tolist() == [0, 0]
    g.replay()
    g.replay()
    assert whole.tolist() == [1, 2] and acc.tolist() == [4, 8]


@pytest.mark.skipif(aot.unavailable_reason() is not None, reason=str(aot.unavailable_reason()))
def test_a_captured_gpt_training_step_compiles_for_a_tpu_chip():
    torch.manual_seed(0)
    model = GPT(GPTConfig()).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    tokens = torch.randint(0, 256, (2, 33), device="tpu")

    def step():
        opt.zero_grad(set_to_none=False)
        loss = model.loss(tokens)
        loss.backward()
        opt.step()

    step()
    g = TPUGraph()
    with torch.tpu.graph(g):
        step()
    specs = aot.on_chip(g.input_specs(), "v5e")
    compiled = aot.compile_lowered(lambda: g.lower(specs), "v5e")
    # one executable: the forward, the backward and AdamW, parameters and moments donated
    assert compiled.summary.flops > 0 and compiled.summary.alias_bytes > 0


def test_graphed_callables_train_inside_an_eager_loop_as_cpu_does():
    torch.manual_seed(0)
    block_c, head_c = _mlp(), torch.nn.Linear(4, 2)
    block_t, head_t = copy.deepcopy(block_c).to("tpu"), copy.deepcopy(head_c).to("tpu")
    opt_c = torch.optim.SGD([*block_c.parameters(), *head_c.parameters()], lr=0.1)
    opt_t = torch.optim.SGD([*block_t.parameters(), *head_t.parameters()], lr=0.1)
    graphed = torch.tpu.make_graphed_callables(block_t, (torch.randn(5, 8, device="tpu", requires_grad=True),))
    assert graphed is block_t
    for _ in range(3):
        x = torch.randn(5, 8)
        xt = x.to("tpu").requires_grad_()
        xc = x.clone().requires_grad_()
        for block, head, opt, inp in ((block_c, head_c, opt_c, xc), (graphed, head_t, opt_t, xt)):
            opt.zero_grad()
            head(block(inp)).square().mean().backward()
            opt.step()
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-6)
    for p, q in zip([*block_t.parameters(), *head_t.parameters()], [*block_c.parameters(), *head_c.parameters()]):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    block_t.eval()                                   # another training state: the original forward
    torch.testing.assert_close(block_t(xt).detach().cpu(), block_c.eval()(xc).detach(), rtol=1e-5, atol=1e-6)
