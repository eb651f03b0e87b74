"""Random lowerings (registry/xla/random.py): reproducibility under torch.manual_seed,
distribution checks on 10k+ samples, dropout semantics."""
from __future__ import annotations

import math

import pytest
import torch
from helpers import assert_same, to_tpu

aten = torch.ops.aten
N = 20_000


def seeded(fn, seed=123):
    torch.manual_seed(seed)
    return fn().cpu()


def moments_ok(x: torch.Tensor, mean: float, var: float, k: float = 5.0) -> None:
    """Sample mean and variance within k standard errors of the expected values."""
    x = x.double().reshape(-1)
    n = x.numel()
    se_mean = math.sqrt(var / n)
    assert abs(x.mean().item() - mean) < k * se_mean, (x.mean().item(), mean)
    # var of the sample variance ~ 2 var^2 / n for near-normal data; loosened for tails
    assert abs(x.var().item() - var) < k * var * math.sqrt(4 / n) + 1e-12, (x.var().item(), var)


FACTORIES = {
    "rand": lambda: torch.rand(N, device="tpu"),
    "randn": lambda: torch.randn(N, device="tpu"),
    "randint": lambda: torch.randint(3, 9, (N,), device="tpu"),
    "randperm": lambda: torch.randperm(50, device="tpu"),
    "normal": lambda: torch.normal(2.0, 3.0, (N,), device="tpu"),
    "uniform_": lambda: torch.empty(N, device="tpu").uniform_(-2, 4),
    "bernoulli": lambda: torch.bernoulli(torch.full((N,), 0.3, device="tpu")),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_reproducible(name):
    fn = FACTORIES[name]
    a, b = seeded(fn), seeded(fn)
    assert torch.equal(a, b)
    assert not torch.equal(seeded(fn, 7), a)
    torch.manual_seed(1)
    first, second = fn().cpu(), fn().cpu()
    assert not torch.equal(first, second)   # consecutive draws differ


def test_rand_randn_dtypes_shapes():
    for dt in (torch.float32, torch.bfloat16):
        x = torch.rand(3, 5, device="tpu", dtype=dt)
        assert x.dtype == dt and x.shape == (3, 5)
        y = torch.randn_like(x)
        assert y.dtype == dt and y.shape == (3, 5)
        z = torch.rand_like(x)
        assert z.dtype == dt and ((z >= 0) & (z < 1)).all().item()
    assert torch.randint(5, (2, 3), device="tpu").dtype == torch.int64
    assert torch.randint(5, (2, 3), device="tpu", dtype=torch.float32).dtype == torch.float32
    x = torch.zeros(4, 4, device="tpu", dtype=torch.int32)
    assert torch.randint_like(x, 10).dtype == torch.int32
    assert torch.rand(0, device="tpu").shape == (0,)
    half = torch.rand(N, device="tpu", dtype=torch.bfloat16).cpu()
    assert ((half >= 0) & (half < 1)).all()      # rounding never reaches 1


def test_uniform_rand():
    torch.manual_seed(0)
    u = torch.rand(N, device="tpu").cpu()
    assert ((u >= 0) & (u < 1)).all()
    moments_ok(u, 0.5, 1 / 12)
    v = torch.empty(N, device="tpu").uniform_(-2, 4).cpu()
    assert ((v >= -2) & (v < 4)).all()
    moments_ok(v, 1.0, 36 / 12)


def test_normal_family():
    torch.manual_seed(0)
    moments_ok(torch.randn(N, device="tpu").cpu(), 0.0, 1.0)
    moments_ok(torch.empty(N, device="tpu").normal_(2.0, 0.5).cpu(), 2.0, 0.25)
    moments_ok(torch.normal(-1.0, 2.0, (N,), device="tpu").cpu(), -1.0, 4.0)
    mean = to_tpu(torch.full((N,), 3.0))
    std = to_tpu(torch.full((N,), 0.5))
    moments_ok(torch.normal(mean, 2.0).cpu(), 3.0, 4.0)
    moments_ok(torch.normal(1.0, std).cpu(), 1.0, 0.25)
    moments_ok(torch.normal(mean, std).cpu(), 3.0, 0.25)
    moments_ok(torch.randn(N, device="tpu", dtype=torch.bfloat16).cpu(), 0.0, 1.0, k=6)


def test_randint_randperm():
    torch.manual_seed(0)
    x = torch.randint(3, 9, (N,), device="tpu").cpu()
    assert x.min() == 3 and x.max() == 8
    moments_ok(x, 5.5, (6 ** 2 - 1) / 12)
    counts = torch.bincount(torch.randint(4, (N,), device="tpu").cpu(), minlength=4)
    assert (abs(counts / N - 0.25) < 5 * math.sqrt(0.25 * 0.75 / N)).all()
    like = torch.randint_like(to_tpu(torch.zeros(N)), -2, 2).cpu()
    assert like.min() == -2 and like.max() == 1
    p = torch.randperm(1000, device="tpu").cpu()
    assert torch.equal(p.sort().values, torch.arange(1000)) and p.dtype == torch.int64
    assert not torch.equal(p, torch.arange(1000))
    assert torch.randperm(0, device="tpu").shape == (0,)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.85])
def test_bernoulli(p):
    torch.manual_seed(0)
    n = N
    se = math.sqrt(p * (1 - p) / n)
    x = torch.bernoulli(to_tpu(torch.full((n,), p))).cpu()
    assert set(x.unique().tolist()) <= {0.0, 1.0}
    assert abs(x.mean().item() - p) < 5 * se
    y = to_tpu(torch.zeros(n)).bernoulli_(p).cpu()
    assert abs(y.mean().item() - p) < 5 * se
    z = to_tpu(torch.zeros(n, dtype=torch.bfloat16)).bernoulli_(to_tpu(torch.full((n,), p))).cpu()
    assert z.dtype == torch.bfloat16 and abs(z.float().mean().item() - p) < 5 * se
    assert abs(aten.bernoulli.p(to_tpu(torch.zeros(n)), p).cpu().mean().item() - p) < 5 * se
    assert torch.bernoulli(to_tpu(torch.tensor([0.0, 1.0]))).cpu().tolist() == [0.0, 1.0]


def test_other_distributions():
    torch.manual_seed(0)
    x = to_tpu(torch.empty(N))
    moments_ok(x.clone().exponential_(2.0).cpu(), 0.5, 0.25, k=6)
    g = x.clone().geometric_(0.25).cpu()
    assert g.min() >= 1 and torch.equal(g, g.round())
    moments_ok(g, 4.0, 0.75 / 0.0625, k=6)
    ln = x.clone().log_normal_(0.0, 0.5).cpu()
    moments_ok(ln.log(), 0.0, 0.25)
    c = x.clone().cauchy_(1.0, 2.0).cpu()
    assert abs(c.median().item() - 1.0) < 0.1        # no moments: check the median
    q = torch.quantile(c, torch.tensor([0.25, 0.75]))
    assert torch.allclose(q, torch.tensor([-1.0, 3.0]), atol=0.25)


def test_random_():
    torch.manual_seed(0)
    x = to_tpu(torch.zeros(N))
    a = x.clone().random_(10).cpu()
    assert a.min() == 0 and a.max() == 9 and torch.equal(a, a.round())
    b = x.clone().random_(-3, 3).cpu()
    assert b.min() == -3 and b.max() == 2
    c = to_tpu(torch.zeros(N, dtype=torch.int16)).random_().cpu()
    assert c.min() >= 0 and c.max() > 30000
    d = x.clone().random_().cpu()
    assert d.min() >= 0 and d.max() <= 2 ** 24 and d.max() > 2 ** 23


def test_multinomial():
    torch.manual_seed(0)
    w = torch.tensor([[1.0, 2.0, 0.0, 5.0], [0.0, 0.0, 1.0, 1.0]])
    s = torch.multinomial(to_tpu(w), N, replacement=True).cpu()
    assert s.shape == (2, N) and s.dtype == torch.int64
    for row, probs in zip(s, w / w.sum(1, keepdim=True)):
        freq = torch.bincount(row, minlength=4) / N
        assert (abs(freq - probs) < 5 * (probs * (1 - probs) / N).sqrt() + 1e-9).all()
    # without replacement: distinct draws, zero-weight categories never drawn
    t = torch.multinomial(to_tpu(torch.rand(6, 10) + 0.1), 10).cpu()
    assert all(torch.equal(r.sort().values, torch.arange(10)) for r in t)
    firsts = torch.multinomial(to_tpu(w[0].expand(4000, 4).contiguous()), 2).cpu()
    assert (firsts != 2).all()
    freq = torch.bincount(firsts[:, 0], minlength=4) / 4000
    assert (abs(freq - w[0] / 8) < 5 * math.sqrt(0.25 / 4000)).all()
    one = torch.multinomial(to_tpu(torch.tensor([0.2, 0.8])), 1)
    assert one.shape == (1,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_native_dropout(dtype, p):
    torch.manual_seed(0)
    x = torch.randn(200, 100).to(dtype)
    out, mask = aten.native_dropout(to_tpu(x), p, True)
    out, mask = out.cpu(), mask.cpu()
    assert mask.dtype == torch.bool and out.dtype == dtype
    expected = x * mask * (1.0 / (1 - p)) if p < 1 else torch.zeros_like(x)
    assert_same(expected, out)
    keep = mask.float().mean().item()
    assert abs(keep - (1 - p)) < 5 * math.sqrt(max(p * (1 - p), 1e-12) / mask.numel()) + 1e-9
    ev_out, ev_mask = aten.native_dropout(to_tpu(x), p, False)
    assert torch.equal(ev_out.cpu(), x) and ev_mask.cpu().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_dropout_backward(dtype):
    g = torch.randn(5, 7).to(dtype)
    m = torch.rand(5, 7) > 0.4
    expected = aten.native_dropout_backward(g, m, 1 / 0.6)
    assert_same(expected, aten.native_dropout_backward(to_tpu(g), to_tpu(m), 1 / 0.6))


def test_dropout_module_grad():
    torch.manual_seed(3)
    x = to_tpu(torch.randn(64, 32)).requires_grad_()
    y = torch.nn.functional.dropout(x, 0.25, training=True)
    y.sum().backward()
    kept = (y.detach().cpu() != 0)
    assert_same(kept.float() / 0.75, x.grad.cpu())


def test_like_factories_with_a_generator():
    """``randn_like(x, generator=g)`` and friends (no tpu impl of their own) run torch's
    CompositeExplicitAutograd kernel: the result is drawn on tpu from ``g``."""
    from tpu_kernels.registry import route
    assert route(torch.ops.aten.randn_like.generator).impl.name == "CompositeExplicitAutograd"
    x = torch.zeros(3, 4, device="tpu")
    g = torch.Generator(device="tpu")
    draws = []
    for _ in range(2):
        g.manual_seed(7)
        draws.append((torch.randn_like(x, generator=g), torch.rand_like(x, generator=g),
                      torch.randint_like(x, 10, generator=g)))
    for a, b in zip(*draws):
        assert a.device.type == "tpu" and a.shape == x.shape and a.dtype == x.dtype
        assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(draws[0][0].cpu(), draws[0][1].cpu())
