"""LayerNorm over the last dim(s): forward (out, mean, rstd as aten.native_layer_norm) and
backward (dx, dweight, dbias as aten.native_layer_norm_backward).

Public (JAX arrays in/out):
    layer_norm(x, weight=None, bias=None, eps=1e-5) -> out            (custom_vjp)
    layer_norm_fwd(x, weight=None, bias=None, eps=1e-5, normalized_ndim=None)
        -> (out, mean, rstd)        mean/rstd: float32, shape x.shape[:-k] + (1,)*k
    layer_norm_bwd(dy, x, mean, rstd, weight=None, bias=None, normalized_ndim=None)
        -> (dx, dweight or None, dbias or None)
    supports(x_shape, x_dtype, weight_shape=None, weight_dtype=None, bias_dtype=None,
             normalized_ndim=None) -> None | reason
Statistics are float32 (torch's CPU kernel returns them in the input dtype; cast in the
binding if exact dtype parity is wanted). Variance is two-pass (mean first) in float32.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
import helion.language as hl

from ._common import compute_dtype, cost, dtype_reason, launch, nbytes, norm_reason
from ._common import partial_tiles, row_block, row_groups

MAX_HIDDEN = 65536


# ------------------------------------------------------------------ helion kernels

def _ln_fwd_kernel(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: hl.constexpr):
    m, n = x.size()
    y = torch.empty_like(x)
    mean = torch.empty([m, 1], dtype=torch.float32, device=x.device)
    rstd = torch.empty([m, 1], dtype=torch.float32, device=x.device)
    for tm in hl.tile(m):
        xf = x[tm, :].to(torch.float32)
        mu = torch.mean(xf, dim=-1, keepdim=True)
        xc = xf - mu
        var = torch.mean(xc * xc, dim=-1, keepdim=True)
        rs = torch.rsqrt(var + eps)
        wf = w[:].to(torch.float32)[None, :]
        bf = b[:].to(torch.float32)[None, :]
        y[tm, :] = (xc * rs * wf + bf).to(y.dtype)
        mean[tm, :] = mu
        rstd[tm, :] = rs
    return y, mean, rstd


def _ln_bwd_dx_kernel(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, mean: torch.Tensor,
                      rstd: torch.Tensor):
    m, n = x.size()
    dx = torch.empty_like(x)
    for tm in hl.tile(m):
        rs = rstd[tm, :]
        xhat = (x[tm, :].to(torch.float32) - mean[tm, :]) * rs
        wdy = dy[tm, :].to(torch.float32) * w[:].to(torch.float32)[None, :]
        c1 = torch.mean(wdy, dim=-1, keepdim=True)
        c2 = torch.mean(xhat * wdy, dim=-1, keepdim=True)
        dx[tm, :] = ((wdy - c1 - xhat * c2) * rs).to(dx.dtype)
    return dx


def _ln_bwd_dwdb_kernel(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor):
    # dy, x: [groups, rows, n]; mean, rstd: [groups, rows, 1]. One partial row per row group.
    g, m, n = x.size()
    dw = torch.empty([g, 1, n], dtype=torch.float32, device=x.device)
    db = torch.empty([g, 1, n], dtype=torch.float32, device=x.device)
    for tg, tn in hl.tile([g, n], block_size=[1, None]):
        gy = dy[tg, :, tn].to(torch.float32)
        xhat = (x[tg, :, tn].to(torch.float32) - mean[tg, :, :]) * rstd[tg, :, :]
        dw[tg, :, tn] = torch.sum(gy * xhat, dim=1, keepdim=True)
        db[tg, :, tn] = torch.sum(gy, dim=1, keepdim=True)
    return dw, db


# ------------------------------------------------------------------ checks

def supports(x_shape, x_dtype, weight_shape=None, weight_dtype=None, bias_dtype=None,
             normalized_ndim: int | None = None) -> str | None:
    extra = [d for d in (weight_dtype, bias_dtype) if d is not None]
    r = dtype_reason(x_dtype, *extra)
    if r:
        return r
    return norm_reason(x_shape, weight_shape, normalized_ndim, MAX_HIDDEN)


# ------------------------------------------------------------------ wrappers

def _prep(x, weight, bias, normalized_ndim):
    x = compute_dtype(jnp.asarray(x))
    k = normalized_ndim if normalized_ndim is not None else (
        weight.ndim if weight is not None else bias.ndim if bias is not None else 1)
    lead = x.shape[: x.ndim - k]
    n = math.prod(x.shape[x.ndim - k:])
    rows = math.prod(lead)
    w2 = jnp.ones((n,), x.dtype) if weight is None else compute_dtype(jnp.asarray(weight)).reshape(n)
    b2 = jnp.zeros((n,), x.dtype) if bias is None else compute_dtype(jnp.asarray(bias)).reshape(n)
    return x, x.reshape(rows, n), w2, b2, lead, k


def layer_norm_fwd(x, weight=None, bias=None, eps: float = 1e-5, normalized_ndim=None):
    x, x2, w2, b2, lead, k = _prep(x, weight, bias, normalized_ndim)
    rows, n = x2.shape
    y, mean, rstd = launch(_ln_fwd_kernel, {"block_sizes": [row_block(rows, n)]}, x2, w2, b2,
                           float(eps), estimate=cost(8 * x2.size, 2 * nbytes(x2), rows))
    stat_shape = lead + (1,) * k
    return y.reshape(x.shape), mean.reshape(stat_shape), rstd.reshape(stat_shape)


def layer_norm_bwd(dy, x, mean, rstd, weight=None, bias=None, normalized_ndim=None):
    x, x2, w2, _, lead, k = _prep(x, weight, bias, normalized_ndim)
    rows, n = x2.shape
    dy2 = compute_dtype(jnp.asarray(dy)).astype(x.dtype).reshape(rows, n)
    mu2 = jnp.asarray(mean, jnp.float32).reshape(rows, 1)
    rs2 = jnp.asarray(rstd, jnp.float32).reshape(rows, 1)
    dx = launch(_ln_bwd_dx_kernel, {"block_sizes": [row_block(rows, n)]}, dy2, x2, w2, mu2, rs2,
                estimate=cost(10 * x2.size, 3 * nbytes(x2)))
    dw = db = None
    if weight is not None or bias is not None:
        # two stages: per (row tile, column tile) partial rows, then their sum
        bm, bn, rp, cp = partial_tiles(rows, n, x2.dtype.itemsize)
        groups = [row_groups(a, bm, rp, c) for a, c in ((dy2, cp), (x2, cp), (mu2, 1), (rs2, 1))]
        parts = launch(_ln_bwd_dwdb_kernel, {"block_sizes": [bn]}, *groups,
                       estimate=cost(5 * rp * cp, 2 * nbytes(x2) + 8 * (rp // bm) * cp))
        dw_, db_ = (p.sum(axis=(0, 1)) for p in parts)
        if weight is not None:
            dw = dw_[:n].reshape(weight.shape).astype(compute_dtype(jnp.asarray(weight)).dtype)
        if bias is not None:
            db = db_[:n].reshape(bias.shape).astype(compute_dtype(jnp.asarray(bias)).dtype)
    return dx.reshape(x.shape), dw, db


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layer_norm(x, weight, bias, eps):
    return layer_norm_fwd(x, weight, bias, eps)[0]


def _layer_norm_f(x, weight, bias, eps):
    y, mean, rstd = layer_norm_fwd(x, weight, bias, eps)
    return y, (x, weight, bias, mean, rstd)


def _layer_norm_b(eps, res, dy):
    x, weight, bias, mean, rstd = res
    dx, dw, db = layer_norm_bwd(dy, x, mean, rstd, weight, bias)
    return dx.astype(x.dtype), dw, db


_layer_norm.defvjp(_layer_norm_f, _layer_norm_b)


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5):
    """torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps); differentiable."""
    x = compute_dtype(jnp.asarray(x))
    n = x.shape[-1:]
    w = jnp.ones(n, x.dtype) if weight is None else compute_dtype(jnp.asarray(weight))
    b = jnp.zeros(n, x.dtype) if bias is None else compute_dtype(jnp.asarray(bias))
    return _layer_norm(x, w, b, float(eps))
