"""Gated linear units: SwiGLU (silu(a)*b), GEGLU (gelu(a)*b, exact erf or tanh
approximation) and torch.nn.functional.glu (a*sigmoid(b) over halves of a dim),
forward and backward, as elementwise Helion kernels over [rows, cols] tiles.

All share one kernel pair: ``out = act(a) * b`` and its backward
``da = dy * b * act'(a), db = dy * act(a)``; ``glu`` calls it with the halves
swapped (act = sigmoid on the second half). The tanh GELU is written out with
``torch.tanh`` (Helion's Pallas backend does not lower ``gelu(approximate="tanh")``).

Public (JAX arrays in/out; a, b same shape and dtype):
    swiglu(a, b) -> out                     (custom_vjp)
    geglu(a, b, approximate="none") -> out  (custom_vjp; "none" or "tanh")
    glu(x, dim=-1) -> out                   (custom_vjp; last dim only)
    gated_fwd(a, b, act) / gated_bwd(dy, a, b, act) -> (da, db);
        act in {"silu", "gelu", "gelu_tanh", "sigmoid"}
    supports(shape, dtype, dim=-1, glu_halves=False, approximate="none") -> None | reason
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
import helion.language as hl

from ._common import compute_dtype, cost, dtype_reason, launch, nbytes, pad2, pow2_floor, round_up

_ACTS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "sigmoid": 3}
_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_K0 = 0.7978845608028654   # sqrt(2/pi)
_K1 = 0.044715


# ------------------------------------------------------------------ helion kernels

def _gated_fwd_kernel(a: torch.Tensor, b: torch.Tensor, act: hl.constexpr):
    m, n = a.size()
    out = torch.empty_like(a)
    for tm, tn in hl.tile([m, n]):
        av = a[tm, tn].to(torch.float32)
        bv = b[tm, tn].to(torch.float32)
        if act == 0:
            g = av * torch.sigmoid(av)
        elif act == 1:
            g = 0.5 * av * (1.0 + torch.erf(av * 0.7071067811865476))
        elif act == 2:
            g = 0.5 * av * (1.0 + torch.tanh(0.7978845608028654 * (av + 0.044715 * av * av * av)))
        else:
            g = torch.sigmoid(av)
        out[tm, tn] = (g * bv).to(out.dtype)
    return out


def _gated_bwd_kernel(dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, act: hl.constexpr):
    m, n = a.size()
    da = torch.empty_like(a)
    db = torch.empty_like(b)
    for tm, tn in hl.tile([m, n]):
        g_out = dy[tm, tn].to(torch.float32)
        av = a[tm, tn].to(torch.float32)
        bv = b[tm, tn].to(torch.float32)
        if act == 0:
            s = torch.sigmoid(av)
            g = av * s
            dg = s * (1.0 + av * (1.0 - s))
        elif act == 1:
            cdf = 0.5 * (1.0 + torch.erf(av * 0.7071067811865476))
            g = av * cdf
            dg = cdf + av * torch.exp(-0.5 * av * av) * 0.3989422804014327
        elif act == 2:
            inner = 0.7978845608028654 * (av + 0.044715 * av * av * av)
            t = torch.tanh(inner)
            g = 0.5 * av * (1.0 + t)
            dg = 0.5 * (1.0 + t) + 0.5 * av * (1.0 - t * t) * 0.7978845608028654 * (
                1.0 + 3.0 * 0.044715 * av * av)
        else:
            s = torch.sigmoid(av)
            g = s
            dg = s * (1.0 - s)
        da[tm, tn] = (g_out * bv * dg).to(da.dtype)
        db[tm, tn] = (g_out * g).to(db.dtype)
    return da, db


# ------------------------------------------------------------------ configs / checks

def _cfg(rows: int, cols: int) -> dict:
    """cols is a multiple of 128 (the wrapper pads); the column tile divides it because
    Pallas interpret mode cannot run partial column tiles of a 2-D tile loop."""
    bn = 128
    while bn < 2048 and cols % (2 * bn) == 0:
        bn *= 2
    bm = max(16, min(256, pow2_floor(max(131072 // bn, 1))))
    return {"block_sizes": [bm, bn]}


def supports(shape, dtype, dim: int = -1, glu_halves: bool = False, approximate: str = "none") -> str | None:
    """``glu_halves=True`` checks torch.nn.functional.glu's input (split along ``dim``)."""
    r = dtype_reason(dtype)
    if r:
        return r
    if approximate not in ("none", "tanh"):
        return f"unknown gelu approximation {approximate!r}"
    if len(shape) == 0:
        return "0-d input"
    if math.prod(shape) == 0:
        return "zero-size input"
    if glu_halves:
        if dim not in (-1, len(shape) - 1):
            return f"glu dim {dim} is not the last dim"
        if shape[-1] % 2:
            return f"glu: dim size {shape[-1]} is odd"
    return None


# ------------------------------------------------------------------ wrappers

def _rows(x):
    """[..., n] -> [rows, n padded to a multiple of 128] (zero padding, sliced off after)."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    return pad2(x2, x2.shape[0], round_up(n, 128))


def _unrows(y, shape):
    return y[:, : shape[-1]].reshape(shape)


def gated_fwd(a, b, act: str):
    a = compute_dtype(jnp.asarray(a))
    b = compute_dtype(jnp.asarray(b)).astype(a.dtype)
    a2, b2 = _rows(a), _rows(b)
    out = launch(_gated_fwd_kernel, _cfg(*a2.shape), a2, b2, _ACTS[act],
                 estimate=cost(8 * a2.size, 3 * nbytes(a2), a2.size))
    return _unrows(out, a.shape)


def gated_bwd(dy, a, b, act: str):
    a = compute_dtype(jnp.asarray(a))
    b = compute_dtype(jnp.asarray(b)).astype(a.dtype)
    dy = compute_dtype(jnp.asarray(dy)).astype(a.dtype)
    a2 = _rows(a)
    da, db = launch(_gated_bwd_kernel, _cfg(*a2.shape), _rows(dy), a2, _rows(b), _ACTS[act],
                    estimate=cost(16 * a2.size, 5 * nbytes(a2), 2 * a2.size))
    return _unrows(da, a.shape), _unrows(db, a.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gated(a, b, act):
    return gated_fwd(a, b, act)


def _gated_f(a, b, act):
    return gated_fwd(a, b, act), (a, b)


def _gated_b(act, res, dy):
    a, b = res
    da, db = gated_bwd(dy, a, b, act)
    return da, db


_gated.defvjp(_gated_f, _gated_b)


def _pair(a, b):
    a = compute_dtype(jnp.asarray(a))
    b = compute_dtype(jnp.asarray(b))
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a and b must match: {a.shape} {a.dtype} vs {b.shape} {b.dtype}")
    return a, b


def swiglu(a, b):
    """silu(a) * b; differentiable."""
    return _gated(*_pair(a, b), "silu")


def geglu(a, b, approximate: str = "none"):
    """gelu(a, approximate) * b; differentiable."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"unknown gelu approximation {approximate!r}")
    return _gated(*_pair(a, b), "gelu" if approximate == "none" else "gelu_tanh")


def glu(x, dim: int = -1):
    """torch.nn.functional.glu(x, dim): first half * sigmoid(second half); differentiable.
    Last dim only; the halves are sliced by XLA before the kernel."""
    x = compute_dtype(jnp.asarray(x))
    if dim not in (-1, x.ndim - 1):
        raise ValueError(f"helion glu handles the last dim only (got dim={dim})")
    h = x.shape[-1] // 2
    if x.shape[-1] != 2 * h:
        raise ValueError("glu: last dim must be even")
    first, second = x[..., :h], x[..., h:]
    return _gated(second, first, "sigmoid")
