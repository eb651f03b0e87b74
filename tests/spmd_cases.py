"""SPMD cases run in a fresh process with 8 CPU devices (``tests/test_spmd.py`` starts it:
XLA_FLAGS must be set before jax starts). ``python tests/spmd_cases.py CASE`` prints
``ok CASE`` when every check passed."""
from __future__ import annotations

import copy
import os
import sys
import time

# kept: flags the test run set (conftest: the CPU backend's optimization level)
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import tpu_kernels  # noqa: E402,F401
from tpu_kernels import spmd  # noqa: E402
from tpu_kernels.models import GPT, GPTConfig, train  # noqa: E402

TINY = GPTConfig(vocab=64, seq=8, dim=32, heads=4, layers=1)


def api() -> None:
    mesh = spmd.Mesh((2, 4), ("fsdp", "tp"))
    x_cpu = torch.randn(8, 16)
    x = spmd.mark_sharding(x_cpu.to("tpu"), mesh, ("fsdp", "tp"))
    assert spmd.local_shapes(x) == [(4, 4)] * 8
    assert spmd.spec_of(x) == ("fsdp", "tp")
    y = spmd.mark_sharding(x_cpu.to("tpu"), mesh, (None, "tp"))
    assert spmd.local_shapes(y) == [(8, 4)] * 8
    plain = x_cpu.to("tpu")
    # one op, three input layouts: jax compiles each (no executable mixes shardings)
    for t in (plain, x, y, plain):
        torch.testing.assert_close((t * 2 + 1).cpu(), x_cpu * 2 + 1)
    assert spmd.local_shapes(x * 2) == [(4, 4)] * 8
    torch.testing.assert_close((x @ y.T).cpu(), x_cpu @ x_cpu.T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.sum(0).cpu(), x_cpu.sum(0), rtol=1e-5, atol=1e-5)
    # an in-place write keeps the storage's layout
    x.add_(torch.ones(8, 16, device="tpu"))
    assert spmd.spec_of(x) == ("fsdp", "tp")
    torch.testing.assert_close(x.cpu(), x_cpu + 1)
    with pytest.raises(ValueError, match="not in the mesh"):
        spmd.mark_sharding(x, mesh, ("dp", None))
    with pytest.raises(ValueError, match="names 1 dims"):
        spmd.mark_sharding(x, mesh, ("fsdp",))
    with pytest.raises(ValueError, match="view"):
        spmd.mark_sharding(x[1:], mesh, (None, None))
    with pytest.raises(ValueError, match="needs 16 devices"):
        spmd.Mesh((4, 4), ("a", "b"))
    # torch.compile and deferred mode compile the whole sharded program
    f = torch.compile(lambda a, b: torch.relu(a @ b.T).sum(1), backend="tpu")
    torch.testing.assert_close(f(x, y).cpu(), torch.relu((x_cpu + 1) @ x_cpu.T).sum(1),
                               rtol=1e-5, atol=1e-5)
    with tpu_kernels.deferred():
        z = (x * y).exp().mean(1)
    torch.testing.assert_close(z.cpu(), ((x_cpu + 1) * x_cpu).exp().mean(1), rtol=1e-5, atol=1e-5)


def many_in_flight() -> None:
    """Thousands of sharded programs queued without a read in between finish: on the CPU
    backend about 100 in flight at once deadlock in XLA's collective rendezvous, which
    ``tpu_kernels.inflight`` bounds (without it the raw loop below aborts the process)."""
    from tpu_kernels import inflight
    mesh = spmd.Mesh((8,), ("fsdp",))       # several CPU devices: the bound is on
    sharded = mesh.sharding(("fsdp", None))
    f = jax.jit(lambda a, k: (a * k).sum(0), out_shardings=mesh.sharding(()))
    a = jax.device_put(jax.numpy.ones((64, 256)), sharded)
    outs = [inflight.track(f(a, float(k))) for k in range(4000)]   # as fast as jax queues
    assert float(outs[-1][0]) == 64 * 3999
    x_cpu = torch.randn(64, 32)
    x = spmd.mark_sharding(x_cpu.to("tpu"), mesh, ("fsdp", None))
    ys = [(x * k).sum(0) for k in range(500)]   # the eager path, each an all-reduce
    torch.testing.assert_close(ys[-1].cpu(), (x_cpu * 499).sum(0), rtol=1e-4, atol=1e-3)


def _check_sharded(model: nn.Module, mesh: spmd.Mesh, opt_state_of: dict | None = None) -> None:
    """Every parameter (and its AdamW moments) sharded as placed: each device holds
    1/shards of it."""
    n_sharded = 0
    for name, p in model.named_parameters():
        spec = spmd.spec_of(p)
        shards = [spmd.local_shapes(p)]
        if opt_state_of is not None:
            state = opt_state_of[p]
            for k in ("exp_avg", "exp_avg_sq"):
                assert spmd.spec_of(state[k]) == spec, (name, k, spmd.spec_of(state[k]), spec)
                shards.append(spmd.local_shapes(state[k]))
        expect = tuple(n // mesh.size(spec[d]) for d, n in enumerate(p.shape))
        for s in shards:
            assert s == [expect] * 8, (name, spec, s, expect)
        n_sharded += any(a is not None for a in spec)
    assert n_sharded, "nothing was sharded"


def _train_both(make, shard, mode: str = "eager", steps: int = 5):
    """Train a sharded and an unsharded copy of the same model; compare losses and
    parameters; return the sharded model and its optimizer."""
    torch.manual_seed(0)
    ref_cpu = make()
    batch = torch.randint(0, TINY.vocab, (8, TINY.seq + 1))
    plain = copy.deepcopy(ref_cpu).to("tpu")
    sharded = shard(copy.deepcopy(ref_cpu).to("tpu"))
    kw = dict(deferred=mode == "deferred", compiled=mode == "compiled")
    t = time.perf_counter()
    want = train(plain, (batch.to("tpu"),), steps, **kw)
    t1 = time.perf_counter() - t
    t = time.perf_counter()
    got = train(sharded, (batch.to("tpu"),), steps, **kw)
    t8 = time.perf_counter() - t
    cpu = train(ref_cpu, (batch,), steps)
    print(f"{mode}: {steps} steps, 1 device {t1:.1f} s (first compiles included), "
          f"8 devices {t8:.1f} s")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(cpu), rtol=1e-4, atol=1e-4)
    # the trained models agree (parameters are not compared one by one: where a gradient is
    # ~0, Adam's normalisation turns reduction-order rounding into steps of up to lr)
    with torch.no_grad():
        torch.testing.assert_close(sharded(batch[:, :-1].to("tpu")).cpu(),
                                   plain(batch[:, :-1].to("tpu")).cpu(), rtol=1e-4, atol=1e-4)
    return sharded


def gpt_fsdp(mode: str = "eager") -> None:
    mesh = spmd.Mesh((8,), ("fsdp",))
    sharded = _train_both(lambda: GPT(TINY), lambda m: spmd.fsdp(m, mesh), mode)
    _check_sharded(sharded, mesh)
    _check_optimizer_follows(sharded, mesh)


def _check_optimizer_follows(model: nn.Module, mesh: spmd.Mesh) -> None:
    """One AdamW step on the sharded model: its moments are sharded as the parameters."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, TINY.vocab, (8, TINY.seq + 1), device="tpu")
    model.loss(batch).backward()
    opt.step()
    _check_sharded(model, mesh, opt.state)


GPT_TP_PLAN = {"blocks.*.attn.qkv": "colwise", "blocks.*.attn.proj": "rowwise",
               "blocks.*.mlp.0": "colwise", "blocks.*.mlp.2": "rowwise"}


def gpt_2d(mode: str = "eager") -> None:
    mesh = spmd.Mesh((2, 4), ("fsdp", "tp"))

    def shard(m):
        spmd.tensor_parallel(m, mesh, GPT_TP_PLAN, axis="tp")
        return spmd.fsdp(m, mesh, "fsdp")
    sharded = _train_both(lambda: GPT(TINY), shard, mode)
    specs = spmd.shardings(sharded)
    assert specs["blocks.0.attn.qkv.weight"] == ("tp", "fsdp")
    assert specs["blocks.0.attn.proj.weight"] == ("fsdp", "tp")
    _check_sharded(sharded, mesh)


class MoE(nn.Module):
    """A top-2 mixture of GELU experts stacked on dim 0 (every expert runs on every token,
    weighted by the router's renormalised top-2 gates: one einsum, shardable over experts)."""

    def __init__(self, dim: int, hidden: int, experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) * dim ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) * hidden ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        top, idx = logits.topk(2, dim=-1)
        gates = torch.zeros_like(logits).scatter(-1, idx, top.softmax(-1))
        h = F.gelu(torch.einsum("btd,edf->btef", x, self.w1))
        return torch.einsum("btef,efd,bte->btd", h, self.w2, gates)


class MoEGPT(GPT):
    def __init__(self, cfg: GPTConfig, experts: int = 8) -> None:
        super().__init__(cfg)
        for b in self.blocks:
            b.mlp = MoE(cfg.dim, 2 * cfg.dim, experts)


def moe_experts(mode: str = "eager") -> None:
    mesh = spmd.Mesh((8,), ("ep",))
    plan = {"blocks.*.mlp": {"w1": ("ep", None, None), "w2": ("ep", None, None)}}
    sharded = _train_both(lambda: MoEGPT(TINY),
                          lambda m: spmd.tensor_parallel(m, mesh, plan, axis="ep"), mode)
    assert spmd.local_shapes(sharded.blocks[0].mlp.w1) == [(1, TINY.dim, 2 * TINY.dim)] * 8
    _check_sharded(sharded, mesh)
    _check_optimizer_follows(sharded, mesh)


def pallas_per_shard() -> None:
    """Pallas kernels (interpret mode) run per shard inside a sharded program: flash
    attention over heads, a grouped matmul over experts; nothing is gathered."""
    from tpu_kernels.pallas.flash_attention import flash_attention
    from tpu_kernels.pallas.grouped_matmul import gmm
    mesh = spmd.Mesh((8,), ("tp",))
    heads = (None, "tp", None, None)
    q, k, v = (torch.randn(1, 8, 128, 64) for _ in range(3))
    attend = spmd.per_shard(lambda a, b, c: flash_attention(a, b, c, causal=True, interpret=True),
                            mesh, [heads] * 3, heads)
    out = attend(*(t.to("tpu") for t in (q, k, v)))
    assert spmd.spec_of(out) == heads and spmd.local_shapes(out) == [(1, 1, 128, 64)] * 8
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               rtol=2e-5, atol=2e-5)
    placed = [jax.device_put(t.numpy(), mesh.sharding(heads)) for t in (q, k, v)]
    hlo = attend.program.lower(*placed).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo     # each device its heads
    # experts over "tp": each device multiplies its tokens by its one expert (16 rows each)
    x, w = torch.randn(8 * 16, 32), torch.randn(8, 32, 64)
    sizes = torch.full((8,), 16, dtype=torch.int32)
    experts = spmd.per_shard(lambda a, b, g: gmm(a, b, g, interpret=True), mesh,
                             [("tp", None), ("tp", None, None), ("tp",)], ("tp", None))
    y = experts(x.to("tpu"), w.to("tpu"), sizes.to("tpu"))
    assert spmd.local_shapes(y) == [(16, 64)] * 8
    want = torch.cat([x[16 * e:16 * (e + 1)] @ w[e] for e in range(8)])
    torch.testing.assert_close(y.cpu(), want, rtol=1e-5, atol=1e-5)


def _collectives(hlo: str) -> list[str]:
    """The collective instructions of a compiled HLO text (their result shapes first)."""
    kinds = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
    return [line.split("=", 1)[1].strip()[:80] for line in hlo.splitlines()
            if any(f" {k}(" in line or f" {k}-start(" in line for k in kinds)]


def dispatch_per_shard() -> None:
    """The dispatcher's Pallas flash attention (forward and backward) and grouped matmul
    on tpu tensors sharded over heads / experts run per shard (spmd_kernels): results
    equal the unsharded ones, stay sharded, and the programs gather nothing big."""
    from tpu_kernels import dispatch, registry
    from tpu_kernels.registry.bindings.flash_attention import sdpa_flash
    from tpu_kernels.registry.bindings.grouped_matmul import grouped_mm
    mesh = spmd.Mesh((8,), ("tp",))
    heads = (None, "tp", None, None)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 8, 128, 64) for _ in range(3))
    fused = str(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    bwd = fused.replace("_cpu.default", "_cpu_backward.default")
    before = dict(dispatch.op_counts())
    with registry.interpret():
        ts = [spmd.mark_sharding(t.to("tpu"), mesh, heads).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*ts, is_causal=True)
        out.sum().backward()
    counts = dispatch.op_counts()
    for op in (fused, bwd):
        assert counts.get((op, "pallas"), 0) > before.get((op, "pallas"), 0), f"{op} not pallas"
    assert spmd.spec_of(out) == heads and spmd.local_shapes(out) == [(1, 1, 128, 64)] * 8
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*ref, is_causal=True)
    want.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), want.detach(), rtol=2e-5, atol=2e-5)
    for t, r in zip(ts, ref):
        assert spmd.spec_of(t.grad) == heads
        torch.testing.assert_close(t.grad.cpu(), r.grad, rtol=1e-4, atol=1e-4)
    # a model's layout: [b, s, h, d] projections viewed as [b, h, s, d]; the output and dq
    # follow the query's layout (strides not contiguous), and their storages keep the heads
    # sharded (a storage laid out flat would gather them whole onto every device)
    with registry.interpret():
        bs = [spmd.mark_sharding(t.transpose(1, 2).contiguous().to("tpu"), mesh,
                                 (None, None, "tp", None)).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*(b.transpose(1, 2) for b in bs), is_causal=True)
        out.sum().backward()
    assert not out.is_contiguous() and spmd.spec_of(out) == heads
    assert tuple(out._tpu_storage.array.sharding.spec) == (None, None, "tp")
    torch.testing.assert_close(out.detach().cpu(), want.detach(), rtol=2e-5, atol=2e-5)
    for b, r in zip(bs, ref):
        assert spmd.spec_of(b.grad) == (None, None, "tp", None)
        torch.testing.assert_close(b.grad.cpu().transpose(1, 2), r.grad, rtol=1e-4, atol=1e-4)
    # the program the binding makes: no collective at all (each device its heads)
    placed = [jax.device_put(t.numpy(), mesh.sharding(heads)) for t in (q, k, v)]
    with registry.interpret():
        hlo = jax.jit(lambda a, b, c: sdpa_flash(a, b, c, is_causal=True)).lower(
            *placed).compile().as_text()
    assert not _collectives(hlo), _collectives(hlo)
    # experts over "tp": torch._grouped_mm with the weights sharded; only the 8 row
    # offsets are gathered and the output all-reduced, never the expert weights
    x = torch.randn(100, 32, dtype=torch.bfloat16)
    w = torch.randn(8, 32, 64, dtype=torch.bfloat16)
    offs = torch.tensor([10, 10, 40, 60, 65, 90, 92, 100], dtype=torch.int32)
    with registry.interpret():
        ws = spmd.mark_sharding(w.to("tpu"), mesh, ("tp", None, None))
        y = torch._grouped_mm(x.to("tpu"), ws, offs.to("tpu"))
    assert counts.get((str(torch.ops.aten._grouped_mm.default), "pallas"), 0) < \
        dispatch.op_counts().get((str(torch.ops.aten._grouped_mm.default), "pallas"), 0)
    starts = [0] + offs.tolist()[:-1]
    want = torch.cat([x[a:b].float() @ w[e].float() for e, (a, b) in
                      enumerate(zip(starts, offs.tolist()))])
    torch.testing.assert_close(y.cpu().float(), want, rtol=2e-2, atol=2e-2)
    args = (jax.device_put(x.float().numpy(), mesh.sharding(())),
            jax.device_put(w.float().numpy(), mesh.sharding(("tp", None, None))),
            jax.device_put(offs.numpy(), mesh.sharding(())))
    with registry.interpret():
        hlo = jax.jit(lambda a, b, o: grouped_mm(a, b, o)).lower(*args).compile().as_text()
    comms = _collectives(hlo)
    assert any(c.startswith("f32[100,64]") and "all-reduce" in c for c in comms), comms
    assert all(c.startswith(("f32[100,64]", "s32[8]")) for c in comms), comms



def _shaped(hlo: str) -> list[tuple[str, str]]:
    """(kind, result shape) of each collective instruction of a compiled HLO text."""
    import re
    found = re.findall(r"= (.+?) (all-gather|all-reduce|all-to-all|reduce-scatter|"
                       r"collective-permute)(?:-start)?\(", hlo)
    return [(kind, shape) for shape, kind in found]


def _kinds(hlo: str) -> list[str]:
    return [kind for kind, _ in _shaped(hlo)]


def _tiny_qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from tpu_kernels import transformers_moe
    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, max_position_embeddings=64, use_cache=False)
    cfg.moe_capacity_factor = 4.0      # experts / top_k: room for every routed copy
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg)
    for n, p in model.named_parameters():
        if "experts" in n or "mlp.gate" in n:
            torch.nn.init.normal_(p, std=0.2)
    assert transformers_moe.use(model) == 1
    return model


def moe_expert_parallel() -> None:
    """A Qwen3-MoE training step (torch.compile, AdamW) with the experts over "ep" and the
    tokens over ("fsdp", "ep") equals the unsharded step; the experts' op exchanges the
    routed tokens by all_to_all and never gathers the batch."""
    from tpu_kernels import spmd_moe
    from tpu_kernels.aot.pod import EP_PLAN
    mesh = spmd.Mesh((2, 4), ("fsdp", "ep"))
    ref = _tiny_qwen3_moe()
    model = copy.deepcopy(ref).to("tpu")
    spmd.tensor_parallel(model, mesh, EP_PLAN, axis="ep")
    spmd.fsdp(model, mesh, "fsdp")
    assert spmd.spec_of(model.model.layers[0].mlp.experts.gate_up_proj) == ("ep", "fsdp", None)
    ref = ref.to("tpu")
    tokens = torch.randint(0, 64, (8, 16))
    losses = []
    for m, t in ((ref, tokens.to("tpu")),
                 (model, spmd.mark_sharding(tokens.to("tpu"), mesh, (("fsdp", "ep"), None)))):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        step = torch.compile(lambda m=m, t=t: m(input_ids=t, labels=t).loss, backend="tpu")
        got = []
        for _ in range(2):
            loss = step()
            loss.backward()
            opt.step()
            opt.zero_grad()
            got.append(loss.item())
        losses.append(got)
    assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-5), losses
    for (n, a), b in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.cpu(), a.cpu(), rtol=1e-4, atol=1e-5, msg=n)
    experts = model.model.layers[0].mlp.experts
    assert spmd.local_shapes(experts.gate_up_proj) == [(2, 16, 32)] * 8
    # the op's own programs: tokens [128, 32] over ("fsdp", "ep"), experts over "ep"
    ts = mesh.sharding((("fsdp", "ep"), None))
    args = (jax.ShapeDtypeStruct((128, 32), jax.numpy.float32, sharding=ts),
            jax.ShapeDtypeStruct((128, 2), jax.numpy.int32, sharding=ts),
            jax.ShapeDtypeStruct((128, 2), jax.numpy.float32, sharding=ts),
            jax.ShapeDtypeStruct((8, 32, 32), jax.numpy.float32,
                                 sharding=mesh.sharding(("ep", "fsdp", None))),
            jax.ShapeDtypeStruct((8, 32, 16), jax.numpy.float32,
                                 sharding=mesh.sharding(("ep", "fsdp", None))))
    fwd = jax.jit(spmd_moe.moe_experts).lower(*args).compile().as_text()
    bwd = jax.jit(spmd_moe.moe_experts_backward).lower(args[0], *args).compile().as_text()
    for hlo, exchanges in ((fwd, 2), (bwd, 4)):     # the backward recomputes the forward
        kinds = _kinds(hlo)
        assert kinds.count("all-to-all") == exchanges, kinds
        # the only gathers are FSDP's of the experts' weights (their [2, 32, n] shards)
        assert all(shape.startswith(("f32[2,32,32]", "f32[2,32,16]"))
                   for kind, shape in _shaped(hlo) if kind == "all-gather"), _shaped(hlo)


def attention_parallel() -> None:
    """Flash attention inside ``spmd_kernels.attention_parallel`` (a shard_map: batch over
    "fsdp", q and kv heads over "tp", GQA 8/4): forward and gradients equal plain
    attention on one device, each device runs the kernel on its own block (no collective),
    and a layout that does not divide the heads is refused (XLA's attention runs)."""
    import jax.numpy as jnp
    import numpy as np
    from tpu_kernels import registry, spmd_kernels
    mesh = spmd.Mesh((2, 4), ("fsdp", "tp"))
    keys = jax.random.split(jax.random.key(0), 4)
    q, do = (jax.random.normal(k, (2, 8, 128, 64), jnp.float32) for k in keys[:2])
    k, v = (jax.random.normal(k, (2, 4, 128, 64), jnp.float32) for k in keys[2:])

    def plain(q, k, v):
        kk, vv = (jnp.repeat(t, 2, axis=1) for t in (k, v))
        s = jnp.einsum("bhsd,bhtd->bhst", q, kk, precision="highest") / 8.0
        s = jnp.where(jnp.tril(jnp.ones((128, 128), bool)), s, -jnp.inf)
        return jnp.einsum("bhst,bhtd->bhsd", jax.nn.softmax(s, -1), vv, precision="highest")
    want, vjp = jax.vjp(plain, q, k, v)
    grads = vjp(do)

    def step(q, k, v, do):
        out, lse = spmd_kernels.flash_attention_fwd(q, k, v, None, causal=True, scale=None)
        return out, spmd_kernels.flash_attention_bwd(do, q, k, v, out, lse, None,
                                                     causal=True, scale=None)
    placed = [jax.device_put(t, mesh.sharding(("fsdp", "tp", None, None)))
              for t in (q, k, v, do)]
    with registry.interpret(), spmd_kernels.attention_parallel(mesh.jax, ("fsdp",), ("tp",)):
        assert spmd_kernels.attention_refusal(q.shape, k.shape, None) is None
        assert "do not divide" in spmd_kernels.attention_refusal((2, 6, 128, 64),
                                                                 (2, 2, 128, 64), None)
        out, (dq, dk, dv) = jax.jit(step)(*placed)
        hlo = jax.jit(step).lower(*placed).compile().as_text()
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    for got, ref in zip((dq, dk, dv), grads):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert out.sharding.spec[:2] == ("fsdp", "tp") and \
        out.addressable_shards[0].data.shape == (1, 2, 128, 64)
    assert not _collectives(hlo), _collectives(hlo)
    assert spmd_kernels.attention_refusal((2, 6, 128, 64), (2, 2, 128, 64), None) is None


if __name__ == "__main__":
    case, *args = sys.argv[1:]
    assert len(jax.devices()) == 8, jax.devices()
    globals()[case](*args)
    print(f"ok {case}")
