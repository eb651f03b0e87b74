"""Hurwitz zeta, trigamma and polygamma, computed the way torch's CPU kernels compute them
(``aten/src/ATen/native/Math.h``, derived from the Cephes Math Library).

``jax.scipy.special.polygamma`` and ``zeta`` are only right for ``x > 0``: for negative
non-integer ``x`` (where torch's results are finite) they give other values, silently. The
algorithms here are torch's, so the two agree everywhere, poles and NaNs included:

    zeta(x, q):      x == 1 -> inf; x < 1 -> nan; q <= 0 integer -> inf; q <= 0 and x not
                     an integer -> nan; else sum (q + i)^-x directly until a term is
                     negligible, or until 9 terms are summed and q + i > 9, then finish
                     with 12 Euler-Maclaurin terms (accumulated in double for float32,
                     float for half types: torch's CPU accumulation types)
    trigamma(x):     reflection pi^2 / sin^2(pi x) below 1/2, 6 recurrence steps, then
                     the asymptotic series
    polygamma(n, x): n = 0 digamma, n = 1 trigamma, else (-1)^(n+1) n! zeta(n + 1, x)
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jss
from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import as_dtype, float_compute

_MACHEP = 1.11022302462515654042e-16
# Euler-Maclaurin denominators: (2k)! / B_2k
_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
      -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
      1.8152105401943546773e17, -7.1661652561756670113e18)


def _acc_dtype(dt) -> jnp.dtype:
    """torch's CPU accumulation type: double for float32 and float64, float for half types."""
    return jnp.dtype(jnp.float32) if jnp.dtype(dt) in (jnp.bfloat16, jnp.float16) else jnp.dtype(jnp.float64)


def torch_zeta(x: jax.Array, q: jax.Array, dt) -> jax.Array:
    """Hurwitz zeta of (x, q), broadcast, computed in ``dt``'s accumulation type."""
    acc = _acc_dtype(dt)
    x, q = jnp.broadcast_arrays(x.astype(acc), q.astype(acc))
    one = jnp.ones((), acc)

    def summing(s):
        i, a, _, _, done = s
        return ~done & ((i < 9) | (a <= 9))

    def add(s):
        i, a, b, total, done = s
        live = summing(s)
        a = jnp.where(live, a + one, a)
        b = jnp.where(live, a ** -x, b)
        total = jnp.where(live, total + b, total)
        small = (-_MACHEP * total < b) & (b < _MACHEP * total)
        return i + live.astype(i.dtype), a, b, total, done | (live & small)

    pole = (q <= 0) & (q == jnp.floor(q))
    special = (x <= 1) | pole | ((q <= 0) & (x != jnp.floor(x)))  # answered below, not summed
    init = (jnp.zeros(x.shape, jnp.int32), q, jnp.zeros_like(q), q ** -x, special)
    _, a, b, s, done = jax.lax.while_loop(lambda s: jnp.any(summing(s)), add, init)
    # Euler-Maclaurin tail for the sums that did not converge directly
    w = a
    s = jnp.where(done, s, s + b * w / (x - one) - 0.5 * b)
    fac, k = one, jnp.zeros((), acc)
    for coef in _A:
        fac = fac * (x + k)
        b = b / w
        t = fac * b / coef
        s = jnp.where(done, s, s + t)
        done = done | (jnp.abs(t / s) < _MACHEP)
        k = k + 1
        fac = fac * (x + k)
        b = b / w
        k = k + 1
    s = jnp.where((q <= 0) & ~pole & (x != jnp.floor(x)), jnp.nan, s)
    s = jnp.where(pole, jnp.inf, s)
    s = jnp.where(x < 1, jnp.nan, s)
    return jnp.where(x == 1, jnp.inf, s)


def trigamma(x: jax.Array) -> jax.Array:
    """torch's trigamma, in ``x``'s dtype."""
    reflect = x < 0.5
    sin_pi_x = jnp.sin(jnp.asarray(math.pi, x.dtype) * x)
    result = jnp.where(reflect, -(jnp.asarray(math.pi ** 2, x.dtype)) / (sin_pi_x * sin_pi_x),
                       jnp.zeros_like(x))
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / x
    return jnp.where(reflect, -result, result)


def digamma(x: jax.Array) -> jax.Array:
    """digamma with torch's value at +-0 (-+inf)."""
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), jss.digamma(x))


def polygamma_values(n: int, x: jax.Array) -> jax.Array:
    """polygamma of order ``n`` (a Python int) in ``x``'s (float) dtype."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    dt = x.dtype
    factor = jnp.exp(jax.lax.lgamma(jnp.asarray(n + 1, dt)))
    zeta = torch_zeta(jnp.asarray(n + 1, dt), x, dt).astype(dt)
    return (factor if n % 2 else -factor) * zeta


@xla("aten::polygamma")
def polygamma(n: int, x):
    dt = out_dtype()
    return polygamma_values(n, x.astype(float_compute(dt))).astype(dt)


def _zeta(x, other):
    dt = out_dtype()
    return torch_zeta(as_dtype(x, dt), as_dtype(other, dt), dt).astype(dt)


xla("aten::special_zeta", "aten::special_zeta.self_scalar", "aten::special_zeta.other_scalar",
    name="special_zeta")(_zeta)
