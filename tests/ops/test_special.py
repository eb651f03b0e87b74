"""Parity of the torch.special lowerings (registry/xla/special.py) and the gamma family."""
from __future__ import annotations

import pytest
import torch

from helpers import check

G = torch.Generator()


@pytest.fixture(autouse=True)
def _seed():
    G.manual_seed(0)


def rand(*shape, low=-3.0, high=3.0, dtype=torch.float32):
    return (torch.rand(*shape, generator=G) * (high - low) + low).to(dtype)


EDGES = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 2.5, 10.0, float("inf"), float("-inf"), float("nan")])

UNARY = {
    "entr": (torch.special.entr, (-1, 3)),
    "erfcx": (torch.special.erfcx, (-2, 5)),
    "i0e": (torch.special.i0e, (-5, 5)),
    "i1": (torch.special.i1, (-5, 5)),
    "i1e": (torch.special.i1e, (-5, 5)),
    "log_ndtr": (torch.special.log_ndtr, (-5, 5)),
    "ndtri": (torch.special.ndtri, (0.01, 0.99)),
    "ndtr": (torch.special.ndtr, (-4, 4)),
    "modified_bessel_i0": (torch.special.modified_bessel_i0, (-5, 5)),
    "modified_bessel_i1": (torch.special.modified_bessel_i1, (-5, 5)),
    "spherical_bessel_j0": (torch.special.spherical_bessel_j0, (-9, 9)),
    "lgamma": (torch.lgamma, (0.1, 6)),
    "digamma": (torch.digamma, (0.1, 6)),
    "i0": (torch.i0, (-5, 5)),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name):
    fn, (lo, hi) = UNARY[name]
    check(fn, rand(4, 6, low=lo, high=hi))
    check(fn, EDGES)


@pytest.mark.parametrize("name", ["lgamma", "digamma", "i0", "i0e"])
def test_unary_bf16_int(name):
    fn, (lo, hi) = UNARY[name]
    check(fn, rand(9, low=max(lo, 0.1), high=hi, dtype=torch.bfloat16))
    check(fn, torch.arange(1, 7))


def test_polygamma_mvlgamma():
    x = rand(5, 4, low=0.5, high=5)
    for n in (0, 1, 2, 3):
        check(lambda t: torch.polygamma(n, t), x)
    # negative arguments (finite between the poles), poles, +-0, inf and nan: torch's
    # reflection (trigamma) and Hurwitz zeta (n >= 2) rules, not jax.scipy's (x > 0 only)
    neg = torch.cat([rand(12, low=-9, high=0.5), EDGES, torch.tensor([-1.0, -2.0, -2.5, -7.25])])
    for n in (0, 1, 2, 3, 4, 5):
        check(lambda t, n=n: torch.polygamma(n, t), neg)
        check(lambda t, n=n: torch.special.polygamma(n, t), neg)
    check(lambda t: torch.polygamma(2, t), rand(6, low=-4, high=4, dtype=torch.bfloat16))
    check(lambda t: torch.mvlgamma(t, 1), x)
    check(lambda t: torch.mvlgamma(t, 3), x + 1.5)


def test_binary():
    x, q = rand(4, 5, low=1.1, high=5), rand(4, 5, low=0.1, high=4)
    check(torch.special.zeta, x, q)
    check(lambda t: torch.special.zeta(t, 2.0), x)
    check(lambda t: torch.special.zeta(3.0, t), q)
    check(torch.special.zeta, torch.tensor([1.0, 0.5, 2.0, 3.0, 2.0]), torch.tensor([1.0, 1.0, -1.5, 0.0, -2.0]))
    # negative non-integer q: finite for integer x, nan otherwise (torch's Cephes rules)
    check(torch.special.zeta, torch.tensor([2.0, 3.0, 4.0, 2.5, 7.0, float("nan"), float("inf")]),
          torch.tensor([-1.5, -3.25, -0.5, -1.5, -12.75, 1.0, 2.0]))
    a, b = rand(4, 5, low=0.1, high=5), rand(4, 5, low=0.0, high=6)
    check(torch.igamma, a, b)
    check(torch.igammac, a, b)


POLYS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
         "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
         "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
         "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", POLYS)
def test_polynomials(name):
    fn = getattr(torch.special, name)
    xs = torch.tensor([-1.0, -0.7, -0.3, 0.0, 0.2, 0.5, 0.9, 1.0, 1.3, -1.5])
    ns = torch.arange(-1, 13, dtype=torch.float32)
    x, n = torch.broadcast_tensors(xs[:, None], ns[None, :])
    check(fn, x.contiguous(), n.contiguous())
    check(lambda t: fn(t, 3), xs)
    check(lambda m: fn(0.4, m), ns)
    check(fn, xs.double(), torch.full((10,), 9.0, dtype=torch.float64))


# torch's Cephes-derived Bessel and Airy functions (registry/xla/bessel.py): every branch
# (small-argument series, asymptotic forms), negative arguments, 0, inf and nan
BESSEL = ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_k0", "modified_bessel_k1",
          "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "airy_ai"]


@pytest.mark.parametrize("name", BESSEL)
def test_bessel_airy(name):
    fn = getattr(torch.special, name)
    x = torch.cat([rand(24, low=-12, high=12), rand(8, low=0, high=2.5), EDGES,
                   torch.tensor([1e-6, 4.99, 5.01, 1.99, 2.01, -2.2, 2.2, 8.5, 30.0, 120.0])])
    check(fn, x)
    check(fn, torch.arange(-2, 7))                       # integers compute in float32
    # the smallest normal floats: K0/K1's log(x/2) must not form x/2, a subnormal XLA
    # flushes to zero (K0 came out inf there; CPU: 87.45)
    tiny = torch.finfo(torch.float32).tiny
    check(fn, torch.tensor([tiny, 1.5 * tiny, 2 * tiny, 4 * tiny]))
    for dt in (torch.bfloat16, torch.float16):           # no half-precision kernels, as on CPU
        with pytest.raises(NotImplementedError) as cpu:
            fn(torch.ones(3, dtype=dt))
        with pytest.raises(NotImplementedError) as tpu:
            fn(torch.ones(3, dtype=dt, device="tpu")).cpu()
        assert str(cpu.value) in str(tpu.value)
