"""``torch.compile(backend="tpu")`` rewrites hand-written RMSNorm, SwiGLU/GeGLU and
rotate_half RoPE (as Hugging Face models write them) to the kernel ops; results and
gradients still match CPU."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import tpu_kernels  # noqa: F401
from tpu_kernels import compile_backend, graph_patterns
from tpu_kernels.testing import tol


def _rms_f32(x, w, eps=1e-6):           # Llama: upcast, normalise, cast back, weight
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(dtype)


def _rms_gemma(x, w, eps=1e-6):         # Gemma: x * x, 1 / sqrt, (1 + w)
    h = x * (1 / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))
    return h * (1.0 + w)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _block(x, w, wg, wu, q, k, cos, sin):
    h = _rms_gemma(_rms_f32(x, w), w)
    mlp = F.silu(h @ wg) * (h @ wu) + F.gelu(h @ wg, approximate="tanh") * (h @ wu)
    cos, sin = cos.unsqueeze(0).unsqueeze(1), sin.unsqueeze(0).unsqueeze(1)
    q2 = q * cos + _rotate_half(q) * sin
    k2 = k * cos + _rotate_half(k) * sin
    return mlp.sum() + (q2 * k2.mean(1, keepdim=True)).sum()


def _args():
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 32), (32,), (32, 48), (32, 48), (1, 4, 6, 16), (1, 2, 6, 16), (6, 16), (6, 16)]
    return [torch.randn(*s, generator=g) for s in shapes]


def _targets(n: int) -> set[str]:
    return {str(node.target) for p in compile_backend.PROGRAMS[n:] for node in p.gm.graph.nodes}


def test_patterns_are_rewritten_and_match_cpu(monkeypatch):
    monkeypatch.delenv("TPU_KERNELS_GRAPH_PATTERNS", raising=False)     # on by default
    cpu = [a.clone().requires_grad_() for a in _args()]
    tpu = [a.to("tpu").requires_grad_() for a in _args()]
    before, n = dict(graph_patterns.REWRITES), len(compile_backend.PROGRAMS)
    out = torch.compile(_block, backend="tpu")(*tpu)
    out.backward()
    ref = _block(*cpu)
    ref.backward()
    done = {k: v - before.get(k, 0) for k, v in graph_patterns.REWRITES.items() if v != before.get(k, 0)}
    assert done == {"rms_norm": 2, "swiglu/geglu": 2, "rope": 1}, done
    targets = _targets(n)
    for op in ("aten._fused_rms_norm.default", "aten._fused_rms_norm_backward.default", "tpu_kernels.swiglu.default",
               "tpu_kernels.geglu.default", "tpu_kernels.rope.default"):
        assert op in targets, (op, sorted(targets))
    assert "aten.rsqrt.default" not in targets
    torch.testing.assert_close(out.cpu(), ref.detach(), **tol(torch.float32, kernel=True))
    for a, b in zip(tpu, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad, **tol(torch.float32, kernel=True))


def test_the_switch_turns_the_pass_off(monkeypatch):
    monkeypatch.setenv("TPU_KERNELS_GRAPH_PATTERNS", "0")
    before, n = dict(graph_patterns.REWRITES), len(compile_backend.PROGRAMS)
    out = torch.compile(_block, backend="tpu")(*[a.to("tpu") for a in _args()])
    assert graph_patterns.REWRITES == before
    assert "aten.rsqrt.default" in _targets(n)
    torch.testing.assert_close(out.cpu(), _block(*_args()), **tol(torch.float32))


def test_in_place_updates_nobody_reads_survive_a_rewrite():
    """A static KV cache's ``cache.index_copy_(...)``: a method call whose result is unused.
    FX's dead-code pass counts every method call as pure; the rewrite must keep it."""
    def f(x, cache, pos):
        cache.index_copy_(0, pos, x)
        return F.silu(x) * x

    x, cache, pos = torch.randn(2, 8), torch.zeros(4, 8), torch.tensor([1, 3])
    tcache = cache.to("tpu")
    before = graph_patterns.REWRITES["swiglu/geglu"]
    out = torch.compile(f, backend="tpu")(x.to("tpu"), tcache, pos.to("tpu"))
    want = f(x, cache, pos)
    assert graph_patterns.REWRITES["swiglu/geglu"] == before + 1
    torch.testing.assert_close(out.cpu(), want, **tol(torch.float32, kernel=True))
    torch.testing.assert_close(tcache.cpu(), cache)


def test_the_pass_leaves_other_graphs_alone(monkeypatch):
    monkeypatch.delenv("TPU_KERNELS_GRAPH_PATTERNS", raising=False)
    def f(x, y):            # a square that is not a norm, a silu used twice
        s = F.silu(x)
        return (x.pow(2).mean(-1, keepdim=True) * s + s * y).sum()
    x, y = _args()[2], _args()[3]
    before = dict(graph_patterns.REWRITES)
    out = torch.compile(f, backend="tpu")(x.to("tpu"), y.to("tpu"))
    assert graph_patterns.REWRITES == before
    torch.testing.assert_close(out.cpu(), f(x, y), **tol(torch.float32))
