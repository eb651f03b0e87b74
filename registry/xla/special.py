"""torch.special functions: jax.scipy.special where it has them, the orthogonal
polynomials by torch's recurrences (with torch's endpoint and large-degree rules).
zeta and polygamma: ``zeta.py``; the Bessel functions JAX lacks (J0, J1, Y0, Y1, K0, K1)
and Airy's Ai: ``bessel.py``.
"""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import jax.scipy.special as jss
import torch
from jax import lax

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import as_dtype, float_compute


def _overloads(name: str) -> list[str]:
    packet = getattr(torch.ops.aten, name)
    return [f"aten::{name}.{o}" for o in packet.overloads() if "out" not in o.lower()]


def float_lowering(fn: Callable) -> Callable:
    """Arguments cast to the compute dtype of torch's (float) result."""
    def lower(*args):
        dt = out_dtype()
        cd = float_compute(dt)
        return fn(*(as_dtype(a, cd) for a in args)).astype(dt)
    lower.__name__ = getattr(fn, "__name__", "special")
    return lower


def _entr(x):
    return jnp.where(jnp.isnan(x), x, _entr_num(x))


def _entr_num(x):
    return jnp.where(x > 0, -x * jnp.log(jnp.where(x > 0, x, 1)), jnp.where(x == 0, 0.0, -jnp.inf).astype(x.dtype))


def _spherical_j0(x):
    j0 = jnp.where(x == 0, jnp.ones_like(x), jnp.sin(x) / jnp.where(x == 0, 1, x))
    return jnp.where(jnp.isinf(x), jnp.zeros_like(x), j0)


_UNARY = {
    "special_entr": _entr, "special_erfcx": jss.erfcx, "special_i0e": jss.i0e,
    "special_i1": jss.i1, "special_i1e": jss.i1e, "special_log_ndtr": jss.log_ndtr,
    "special_ndtri": jss.ndtri, "special_modified_bessel_i0": jss.i0,
    "special_modified_bessel_i1": jss.i1, "special_spherical_bessel_j0": _spherical_j0,
    "special_ndtr": jss.ndtr,
}
for _name, _fn in _UNARY.items():
    xla(f"aten::{_name}", name=_name)(float_lowering(_fn))

_BINARY = {"igamma": jss.gammainc, "igammac": jss.gammaincc}
for _name, _fn in _BINARY.items():
    xla(*_overloads(_name), name=_name)(float_lowering(_fn))


@xla("aten::mvlgamma")
def mvlgamma(x, p: int):
    dt = out_dtype()
    xc = x.astype(float_compute(dt))
    return jss.multigammaln(xc, p).astype(dt)


# -- orthogonal polynomials ----------------------------------------------------------------------
def _recurrence(x, n, q1, step):
    """Value at degree ``n`` (elementwise) of the sequence 1, q1, step(j, p, q) for j = 2..n."""
    top = jnp.max(jnp.where(n >= 2, n, 1)) if n.size else jnp.int64(1)

    def body(carry):
        j, p, q = carry
        r = step(j, p, q)
        live = j <= n
        return j + 1, jnp.where(live, q, p), jnp.where(live, r, q)

    _, _, q = lax.while_loop(lambda c: c[0] <= top, body, (jnp.int64(2), jnp.ones_like(q1), q1))
    return jnp.where(n == 0, jnp.ones_like(x), q)


def _parity(n, even, odd):
    return jnp.where(n % 2 == 0, even, odd)


def _cheb_t(x, n, y):
    """T_n at y (= x, or 2x - 1 for the shifted polynomial)."""
    r = _recurrence(y, n, y, lambda j, p, q: (y + y) * q - p)
    return r, lambda: jnp.cos(n * jnp.arccos(y))


def _cheb_u(x, n, y):
    r = _recurrence(y, n, y + y, lambda j, p, q: (y + y) * q - p)
    a = jnp.arccos(y)
    big = jnp.where(jnp.sin(a) != 0, jnp.sin((n + 1) * a) / jnp.sin(a), (n + 1) * jnp.cos((n + 1) * a) / y)
    return r, lambda: big


def _cheb_v(x, n, y):
    r = _recurrence(y, n, y + y - 1, lambda j, p, q: (y + y) * q - p)
    a = jnp.arccos(y)
    big = jnp.where(jnp.sin(a / 2) != 1, jnp.cos((n + 0.5) * a) / jnp.cos(a / 2), _parity(n, n + n + 1, -(n + n + 1)))
    return r, lambda: big


def _cheb_w(x, n, y):
    r = _recurrence(y, n, y + y + 1, lambda j, p, q: (y + y) * q - p)
    a = jnp.arccos(y)
    big = jnp.where(jnp.cos(a / 2) != 1, jnp.sin((n + 0.5) * a) / jnp.sin(a / 2),
                    jnp.where(y > 0, n + n + 1, _parity(n, 1, -1)))
    return r, lambda: big


# (recurrence, value at the right end, value at the left end, degree above which the
# closed trigonometric form is used inside (-1, 1)) per kind
_CHEBYSHEV = {
    "t": (_cheb_t, lambda n: 1, lambda n: _parity(n, 1, -1), 6),
    "u": (_cheb_u, lambda n: n + 1, lambda n: _parity(n, n + 1, -(n + 1)), 8),
    "v": (_cheb_v, lambda n: 1, lambda n: _parity(n, n + n + 1, -(n + n + 1)), 8),
    "w": (_cheb_w, lambda n: n + n + 1, lambda n: _parity(n, 1, -1), 8),
}
_SHIFTED_BIG = {"t": 6, "u": 6, "v": 6, "w": 4}


def _chebyshev(kind: str, shifted: bool) -> Callable:
    recur, right, left, big_n = _CHEBYSHEV[kind]
    if shifted:
        big_n = _SHIFTED_BIG[kind]

    def fn(x, n):
        n = n.astype(jnp.int64) if hasattr(n, "astype") else jnp.int64(n)
        x, n = jnp.broadcast_arrays(x, n)
        y = x + x - 1 if shifted else x
        at_right, at_left = (x == 1, x == 0) if shifted else (x == 1, x == -1)
        r, trig = recur(x, n, y)
        r = jnp.where((n > big_n) & (jnp.abs(y) < 1), trig(), r)
        r = jnp.where(at_left, left(n), r)
        r = jnp.where(at_right, right(n), r)
        return jnp.where(n < 0, 0, r).astype(x.dtype)
    return fn


def _hermite_h(x, n):
    return _recurrence(x, n, x + x, lambda j, p, q: (x + x) * q - 2 * (j - 1) * p)


def _hermite_he(x, n):
    return _recurrence(x, n, x, lambda j, p, q: x * q - (j - 1) * p)


def _laguerre(x, n):
    r = _recurrence(x, n, 1 - x, lambda j, p, q: ((2 * (j - 1) + (1 - x)) * q - (j - 1) * p) / j)
    return jnp.where(x == 0, jnp.ones_like(x), r)


def _legendre(x, n):
    r = _recurrence(x, n, x, lambda j, p, q: ((2 * (j - 1) + 1) * x * q - (j - 1) * p) / j)
    return jnp.where(jnp.abs(x) == 1, jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0).astype(x.dtype), r)


def _poly(fn: Callable) -> Callable:
    def wrapped(x, n):
        n = n.astype(jnp.int64)
        x, n = jnp.broadcast_arrays(x, n)
        return jnp.where(n < 0, 0, fn(x, n)).astype(x.dtype)
    return wrapped


_POLYNOMIALS: dict[str, Callable] = {
    "special_hermite_polynomial_h": _poly(_hermite_h),
    "special_hermite_polynomial_he": _poly(_hermite_he),
    "special_laguerre_polynomial_l": _poly(_laguerre),
    "special_legendre_polynomial_p": _poly(_legendre),
}
for _kind in "tuvw":
    _POLYNOMIALS[f"special_chebyshev_polynomial_{_kind}"] = _chebyshev(_kind, False)
    _POLYNOMIALS[f"special_shifted_chebyshev_polynomial_{_kind}"] = _chebyshev(_kind, True)


def _register_polynomial(name: str, fn: Callable) -> None:
    def lower(x, n):
        dt = out_dtype()
        cd = float_compute(dt)
        xa = as_dtype(x, cd)
        na = as_dtype(n, cd)  # torch casts the degree to int64 from the common dtype
        return fn(xa, na).astype(dt)
    xla(*_overloads(name), name=name)(lower)


for _name, _fn in _POLYNOMIALS.items():
    _register_polynomial(_name, _fn)
