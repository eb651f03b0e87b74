"""Goodness of fit of the random lowerings (registry/xla/random.py, random_gamma.py): a
chi-square test on bins of equal probability (continuous laws) or on the categories
(discrete laws) for each sampler, and seeded runs that reproduce. Moments are checked in
test_random.py, and here for the gamma family, whose reparameterization gradients must
equal CPU's on the same inputs.

Every test seeds torch's generator, so a run is deterministic; the bound is the chi-square
quantile at 1 - 1e-6, so a correct sampler fails with probability 1e-6 per new seed.
"""
from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
from helpers import check
from scipy import stats

N = 40_000
ALPHA = 1e-6


def chi2_ok(counts: torch.Tensor, probs: torch.Tensor) -> None:
    """Pearson's chi-square statistic of ``counts`` against ``probs`` below its 1 - ALPHA
    quantile (cells with expected count < 5 are merged into the last one)."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    probs = probs / probs.sum()
    expected = probs * counts.sum()
    keep = expected >= 5
    counts = torch.cat([counts[keep], counts[~keep].sum().reshape(1)])
    expected = torch.cat([expected[keep], expected[~keep].sum().reshape(1)])
    if expected[-1] == 0:
        counts, expected = counts[:-1], expected[:-1]
    stat = ((counts - expected) ** 2 / expected).sum().item()
    bound = stats.chi2.ppf(1 - ALPHA, df=len(counts) - 1)
    assert stat < bound, f"chi-square {stat:.1f} >= {bound:.1f} ({len(counts) - 1} dof)"


def quantile_bins(x: torch.Tensor, icdf, bins: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of ``x`` in ``bins`` cells of equal probability under the law ``icdf``."""
    edges = torch.tensor([icdf(q) for q in torch.linspace(0, 1, bins + 1)[1:-1].tolist()], dtype=torch.float64)
    cells = torch.bucketize(x.double().flatten(), edges, right=True)
    return torch.bincount(cells, minlength=bins), torch.ones(bins)


def draw(fn, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return fn().cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_uniform_chi2(dtype):
    x = draw(lambda: torch.empty(N, device="tpu", dtype=dtype).uniform_(-2.0, 3.0))
    # bfloat16 has 8 bits of mantissa: 10 bins whose edges it represents exactly
    bins = 20 if dtype == torch.float32 else 10
    chi2_ok(*quantile_bins(x, lambda q: -2.0 + 5.0 * q, bins))
    chi2_ok(*quantile_bins(draw(lambda: torch.rand(N, device="tpu")), lambda q: q))


def test_normal_chi2():
    law = stats.norm(loc=1.5, scale=2.0)
    chi2_ok(*quantile_bins(draw(lambda: torch.normal(1.5, 2.0, (N,), device="tpu")), law.ppf))
    chi2_ok(*quantile_bins(draw(lambda: torch.empty(N, device="tpu").normal_(1.5, 2.0)), law.ppf))
    chi2_ok(*quantile_bins(draw(lambda: torch.randn(N, device="tpu")), stats.norm().ppf))
    mean = torch.full((N,), 1.5, device="tpu")
    chi2_ok(*quantile_bins(draw(lambda: torch.normal(mean, 2.0)), law.ppf))


def test_exponential_chi2():
    law = stats.expon(scale=1 / 2.5)
    chi2_ok(*quantile_bins(draw(lambda: torch.empty(N, device="tpu").exponential_(2.5)), law.ppf))


@pytest.mark.parametrize("p", [0.2, 0.7])
def test_geometric_chi2(p):
    x = draw(lambda: torch.empty(N, device="tpu").geometric_(p)).long()
    assert x.min() >= 1
    k = torch.arange(1, 40)
    probs = (1 - p) ** (k - 1) * p
    counts = torch.bincount(x.clamp(max=40) - 1, minlength=40)
    probs = torch.cat([probs, torch.tensor([(1 - p) ** 39])])   # the tail P(X >= 40)
    chi2_ok(counts, probs)


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5])
def test_bernoulli_chi2(p):
    x = draw(lambda: torch.bernoulli(torch.full((N,), p, device="tpu"))).long()
    chi2_ok(torch.bincount(x, minlength=2), torch.tensor([1 - p, p]))
    probs = torch.linspace(0.0, 1.0, 8).repeat(N // 8)          # per-element probabilities
    y = draw(lambda: torch.bernoulli(probs.to("tpu"))).reshape(-1, 8)
    chi2_ok(torch.stack([(1 - y).sum(0), y.sum(0)], 1)[1:-1], torch.stack([1 - probs[1:7], probs[1:7]], 1))
    assert y[:, 0].sum() == 0 and y[:, -1].sum() == N // 8         # p = 0 and p = 1 exactly


def test_randint_chi2():
    x = draw(lambda: torch.randint(-3, 7, (N,), device="tpu"))
    assert x.min() == -3 and x.max() == 6
    chi2_ok(torch.bincount(x + 3, minlength=10), torch.ones(10))
    big = draw(lambda: torch.randint(0, 2 ** 40, (N,), device="tpu"))   # int64 range
    chi2_ok(*quantile_bins(big.double() / 2 ** 40, lambda q: q))


def test_multinomial_chi2():
    w = torch.tensor([0.5, 2.0, 0.0, 1.0, 4.0, 0.25])
    x = draw(lambda: torch.multinomial(w.to("tpu"), N, replacement=True))
    counts = torch.bincount(x, minlength=6)
    assert counts[2] == 0
    chi2_ok(counts[w > 0], w[w > 0])
    # without replacement, the first draw follows the weights; the second the renormalised rest
    rows = draw(lambda: torch.multinomial(w.to("tpu").expand(N // 4, 6).contiguous(), 2))
    chi2_ok(torch.bincount(rows[:, 0], minlength=6)[w > 0], w[w > 0])
    assert (rows[:, 0] != rows[:, 1]).all()


def test_randperm_chi2():
    n, reps = 4, 1200
    torch.manual_seed(0)
    draws = torch.stack([torch.randperm(n, device="tpu") for _ in range(reps)]).cpu()
    assert (draws.sort(1).values == torch.arange(n)).all()
    # every permutation of 4 equally likely: 24 categories
    code = (draws * torch.tensor([n ** 3, n ** 2, n, 1])).sum(1)
    perms = torch.tensor(list(itertools.permutations(range(n))))
    counts = torch.stack([(code == c).sum() for c in (perms * torch.tensor([n ** 3, n ** 2, n, 1])).sum(1)])
    assert counts.sum() == reps
    chi2_ok(counts, torch.ones(math.factorial(n)))
    # one long permutation: as many large values in its first half as in its second
    big = draw(lambda: torch.randperm(5000, device="tpu"))
    assert torch.equal(big.sort().values, torch.arange(5000))
    chi2_ok(torch.bincount((big[:2500] >= 2500).long(), minlength=2), torch.ones(2))


SAMPLERS = {
    "uniform": lambda: torch.empty(64, device="tpu").uniform_(),
    "normal": lambda: torch.normal(0.0, 1.0, (64,), device="tpu"),
    "exponential": lambda: torch.empty(64, device="tpu").exponential_(),
    "geometric": lambda: torch.empty(64, device="tpu").geometric_(0.3),
    "bernoulli": lambda: torch.bernoulli(torch.full((64,), 0.4, device="tpu")),
    "multinomial": lambda: torch.multinomial(torch.ones(8, device="tpu"), 64, replacement=True),
    "randint": lambda: torch.randint(0, 100, (64,), device="tpu"),
    "randperm": lambda: torch.randperm(64, device="tpu"),
    "gamma": lambda: torch._standard_gamma(torch.full((64,), 0.7, device="tpu")),
    "dirichlet": lambda: torch._sample_dirichlet(torch.full((16, 4), 0.7, device="tpu")),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_seeded_runs_reproduce(name):
    fn = SAMPLERS[name]
    assert torch.equal(draw(fn, 5), draw(fn, 5))
    assert not torch.equal(draw(fn, 5), draw(fn, 6))
    torch.manual_seed(5)
    first, second = fn().cpu(), fn().cpu()
    assert not torch.equal(first, second)                 # the generator advances


# -- the gamma family (registry/xla/random_gamma.py) ----------------------------------------------
D = torch.distributions


def near(est: torch.Tensor, true: torch.Tensor, se: torch.Tensor, k: float = 5.0) -> None:
    """Estimates within ``k`` standard errors of the true values."""
    est, true, se = est.double().cpu(), true.double().cpu(), se.double().cpu()
    assert ((est - true).abs() < k * se).all(), f"{est} vs {true} (se {se})"


@pytest.mark.parametrize("alpha", [0.1, 1.0, 4.5, 50.0])
def test_standard_gamma_chi2(alpha):
    x = draw(lambda: torch._standard_gamma(torch.full((N,), alpha, device="tpu")))
    assert (x > 0).all()
    chi2_ok(*quantile_bins(x, stats.gamma(alpha).ppf))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_standard_gamma_moments(dtype):
    alpha = torch.tensor([0.1, 0.5, 1.0, 3.0, 50.0], dtype=dtype)
    n = 4000
    x = draw(lambda: torch._standard_gamma(alpha.to("tpu").expand(n, 5)))
    assert x.dtype == dtype and x.shape == (n, 5) and (x > 0).all()
    a = alpha.double()
    near(x.mean(0), a, (a / n).sqrt())
    # the sample variance's variance: (mu4 - var^2) / n = var^2 (2 + 6 / alpha) / n for a gamma
    near(x.var(0), a, a * ((2 + 6 / a) / n).sqrt())
    edge = draw(lambda: torch._standard_gamma(torch.tensor([0.0, float("inf")], dtype=dtype, device="tpu")))
    assert edge[0] == torch.finfo(dtype).tiny and edge[1] == float("inf")   # CPU's clamp


def _gamma_grad_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Alphas and gamma samples reaching each of torch's approximations: small x, large
    alpha near and away from the mode, and the rational fit in between."""
    g = torch.Generator().manual_seed(0)
    alpha = torch.tensor([0.01, 0.1, 0.5, 1.0, 2.5, 7.9, 8.5, 20.0, 50.0, 200.0], dtype=dtype)
    a = alpha.repeat_interleave(30)
    x = torch._standard_gamma(a, generator=g)
    return torch.cat([a, alpha, alpha, alpha]), torch.cat([x, 0.95 * alpha, 1.05 * alpha, 2 * alpha])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_standard_gamma_grad_matches_cpu(dtype):
    check(lambda a, x: torch._standard_gamma_grad(a, x), *_gamma_grad_inputs(dtype))


def _dirichlet_grad_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Beta(alpha, total - alpha) samples with (alpha, total) reaching each approximation:
    x near 0 or 1, both concentrations large, and the rational correction."""
    g = torch.Generator().manual_seed(0)
    pairs = torch.tensor([[0.1, 0.1], [0.5, 2.0], [3.0, 0.3], [2.0, 5.0], [7.0, 9.0], [20.0, 30.0],
                          [50.0, 8.0], [0.05, 40.0], [100.0, 200.0]], dtype=dtype)
    ab = pairs.repeat_interleave(25, 0)
    x = torch._sample_dirichlet(ab, generator=g)[:, 0]
    return x, ab[:, 0].contiguous(), ab.sum(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dirichlet_grad_matches_cpu(dtype):
    check(lambda x, a, t: torch._dirichlet_grad(x, a, t), *_dirichlet_grad_inputs(dtype))
    x, a, t = (v[75:100] for v in _dirichlet_grad_inputs(dtype))    # Beta(2, 5) draws
    check(lambda x, a, t: torch._dirichlet_grad(x, a, t), x.reshape(5, 5), a[:1], t[:1])  # broadcast


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gamma_family_half_types_raise_like_cpu(dtype):
    a = torch.ones(3, dtype=dtype)
    for fn in (torch._standard_gamma, torch._sample_dirichlet, lambda t: torch._standard_gamma_grad(t, t),
               lambda t: torch._dirichlet_grad(t, t, t + 1)):
        with pytest.raises(NotImplementedError) as cpu:
            fn(a)
        with pytest.raises(NotImplementedError, match=re.escape(str(cpu.value).split("\n")[0])):
            fn(a.to("tpu"))


def test_sample_dirichlet_moments():
    alpha = torch.tensor([[0.3, 1.0, 5.0], [2.0, 2.0, 2.0], [0.01, 0.01, 0.01]])
    n = 4000
    x = draw(lambda: torch._sample_dirichlet(alpha.to("tpu").expand(n, 3, 3)))
    assert x.shape == (n, 3, 3) and x.dtype == torch.float32
    assert x.isfinite().all() and (x > 0).all()           # alpha = 0.01: no 0 / 0
    torch.testing.assert_close(x.double().sum(-1), torch.ones(n, 3, dtype=torch.float64))
    a = alpha.double()
    a0 = a.sum(-1, keepdim=True)
    mean, var = a / a0, a * (a0 - a) / (a0 ** 2 * (a0 + 1))
    near(x.mean(0), mean, (var / n).sqrt())
    edge = draw(lambda: torch._sample_dirichlet(torch.tensor([[0.0, 0.0], [1.0, 0.0]], device="tpu")))
    assert torch.equal(edge[0], torch.tensor([0.5, 0.5]))  # CPU's clamp of the gammas: 0 -> tiny
    assert draw(lambda: torch._sample_dirichlet(torch.tensor(2.0, device="tpu"))) == 1 - 2 ** -24


def test_gamma_rsample_grad():
    """Gamma(a, b).rsample's pathwise gradient: d mean / d a = 1 / b, d mean / d b = -a / b^2."""
    a = torch.tensor([0.5, 2.0, 10.0], device="tpu", requires_grad=True)
    b = torch.tensor([1.0, 0.5, 2.0], device="tpu", requires_grad=True)
    n = 1000
    torch.manual_seed(0)
    s = D.Gamma(a, b).rsample((n,))
    assert s.shape == (n, 3) and s.device.type == "tpu" and (s > 0).all()
    (s.mean(0).sum()).backward()
    a0, b0, x = a.detach().cpu(), b.detach().cpu(), s.detach().cpu()
    # each draw's own gradient (CPU's function on the tpu draws) gives the standard errors
    da = torch._standard_gamma_grad(a0.expand(n, 3).contiguous(), x * b0) / b0
    near(a.grad, 1 / b0, da.std(0) / n ** 0.5)
    near(b.grad, -a0 / b0 ** 2, (x / b0).std(0) / n ** 0.5)


def test_dirichlet_rsample_grad():
    """d E[x_0] / d c of Dirichlet(c): ((c0 - c_0) / c0^2, -c_0 / c0^2, ...), c0 = sum(c)."""
    c = torch.tensor([0.5, 1.0, 4.0], device="tpu", requires_grad=True)
    n = 2000
    torch.manual_seed(0)
    x = D.Dirichlet(c).rsample((n,))
    assert x.shape == (n, 3) and x.device.type == "tpu"
    x[:, 0].mean().backward()
    c0, xs = c.detach().cpu(), x.detach().cpu()
    total = c0.sum()
    true = torch.cat([(total - c0[:1]), -c0[:1].expand(2)]) / total ** 2
    dg = torch._dirichlet_grad(xs, c0.expand(n, 3), total.expand(n, 3))   # each draw's gradient
    per_draw = dg * (torch.tensor([1.0, 0, 0]) - xs[:, :1])
    near(c.grad, true, per_draw.std(0) / n ** 0.5)


def test_beta_sample():
    n = 4000
    p, q = torch.tensor([0.5, 2.0]), torch.tensor([0.5, 3.0])
    x = draw(lambda: D.Beta(p.to("tpu"), q.to("tpu")).sample((n,)))
    assert x.shape == (n, 2) and ((x > 0) & (x < 1)).all()
    near(x.mean(0), p / (p + q), (p * q / ((p + q) ** 2 * (p + q + 1)) / n).sqrt())


def test_chi2_and_student_t_sample():
    n = 4000
    torch.manual_seed(0)
    chi2 = D.Chi2(torch.tensor([3.0], device="tpu")).rsample((n,))
    t = D.StudentT(torch.tensor([5.0], device="tpu")).sample((n,))
    assert chi2.device.type == t.device.type == "tpu" and chi2.shape == t.shape == (n, 1)
    chi2, t = chi2.cpu(), t.cpu()
    assert (chi2 > 0).all()
    near(chi2.mean(), torch.tensor(3.0), torch.tensor(6.0 / n).sqrt())
    near(t.mean(), torch.tensor(0.0), torch.tensor(5 / 3 / n).sqrt())
