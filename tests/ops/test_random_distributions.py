"""Goodness of fit of the random lowerings (registry/xla/random.py): a chi-square test on
bins of equal probability (continuous laws) or on the categories (discrete laws) for
each sampler, and seeded runs that reproduce. Moments are checked in test_random.py.

Every test seeds torch's generator, so a run is deterministic; the bound is the chi-square
quantile at 1 - 1e-6, so a correct sampler fails with probability 1e-6 per new seed.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch
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
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_seeded_runs_reproduce(name):
    fn = SAMPLERS[name]
    assert torch.equal(draw(fn, 5), draw(fn, 5))
    assert not torch.equal(draw(fn, 5), draw(fn, 6))
    torch.manual_seed(5)
    first, second = fn().cpu(), fn().cpu()
    assert not torch.equal(first, second)                 # the generator advances
