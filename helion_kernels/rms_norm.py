"""RMSNorm over the last dim(s): forward (saves rstd) and backward (dx, dweight).

Public (JAX arrays in/out):
    rms_norm(x, weight=None, eps=None) -> out                       (custom_vjp)
    rms_norm_fwd(x, weight=None, eps=None, normalized_ndim=None) -> (out, rstd)
    rms_norm_bwd(dy, x, weight, rstd) -> (dx, dweight or None)
    supports(x_shape, x_dtype, weight_shape=None, weight_dtype=None) -> None | reason

``rstd`` is float32 with shape ``x.shape[:-k] + (1,)*k`` like ``aten._fused_rms_norm``;
``eps=None`` means torch's default, the epsilon of the type it computes in (float32 for
bfloat16/float16 inputs, float64 for float64). All math is in float32.
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

def _rms_fwd_kernel(x: torch.Tensor, w: torch.Tensor, eps: hl.constexpr):
    m, n = x.size()
    y = torch.empty_like(x)
    rstd = torch.empty([m, 1], dtype=torch.float32, device=x.device)
    for tm in hl.tile(m):
        xf = x[tm, :].to(torch.float32)
        ms = torch.mean(xf * xf, dim=-1, keepdim=True)
        rs = torch.rsqrt(ms + eps)
        y[tm, :] = (xf * rs * w[:].to(torch.float32)[None, :]).to(y.dtype)
        rstd[tm, :] = rs
    return y, rstd


def _rms_bwd_dx_kernel(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor):
    m, n = x.size()
    dx = torch.empty_like(x)
    for tm in hl.tile(m):
        xf = x[tm, :].to(torch.float32)
        rs = rstd[tm, :]
        xhat = xf * rs
        wdy = dy[tm, :].to(torch.float32) * w[:].to(torch.float32)[None, :]
        c = torch.mean(xhat * wdy, dim=-1, keepdim=True)
        dx[tm, :] = ((wdy - xhat * c) * rs).to(dx.dtype)
    return dx


def _rms_bwd_dw_kernel(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor):
    # dy, x: [groups, rows, n]; rstd: [groups, rows, 1]. One partial row per row group.
    g, m, n = x.size()
    part = torch.empty([g, 1, n], dtype=torch.float32, device=x.device)
    for tg, tn in hl.tile([g, n], block_size=[1, None]):
        prod = dy[tg, :, tn].to(torch.float32) * x[tg, :, tn].to(torch.float32) * rstd[tg, :, :]
        part[tg, :, tn] = torch.sum(prod, dim=1, keepdim=True)
    return part


def default_eps(dtype) -> float:
    """torch's eps when none is given: the epsilon of its compute type, not the input's
    (bfloat16's 0.0078 would swamp a small activation's mean square: rows of values ~0.01
    came out ~9x too small)."""
    return float(jnp.finfo(jnp.promote_types(dtype, jnp.float32)).eps)


# ------------------------------------------------------------------ configs

def _row_cfg(rows: int, n: int) -> dict:
    return {"block_sizes": [row_block(rows, n)]}


def _column_sum(kernel, dy2, x2, r2):
    """Two-stage column reduction: a pipelined grid of (row tile, column tile) blocks, each
    reduced to a partial row, then the partials summed (a [rows / row_tile, n] f32 array)."""
    rows, n = x2.shape
    bm, bn, rp, cp = partial_tiles(rows, n, x2.dtype.itemsize)
    part = launch(kernel, {"block_sizes": [bn]}, row_groups(dy2, bm, rp, cp),
                  row_groups(x2, bm, rp, cp), row_groups(r2, bm, rp, 1),
                  estimate=cost(3 * rp * cp, 2 * nbytes(x2) + 4 * (rp // bm) * cp))
    return part.sum(axis=(0, 1))[:n]


# ------------------------------------------------------------------ checks

def supports(x_shape, x_dtype, weight_shape=None, weight_dtype=None, normalized_ndim: int | None = None) -> str | None:
    """None if the kernel handles these arguments, else why not."""
    r = dtype_reason(x_dtype, *([weight_dtype] if weight_dtype is not None else []))
    if r:
        return r
    return norm_reason(x_shape, weight_shape, normalized_ndim, MAX_HIDDEN)


# ------------------------------------------------------------------ wrappers

def _prep(x, weight, normalized_ndim):
    x = compute_dtype(jnp.asarray(x))
    k = normalized_ndim if normalized_ndim is not None else (weight.ndim if weight is not None else 1)
    lead = x.shape[: x.ndim - k]
    n = math.prod(x.shape[x.ndim - k:])
    rows = math.prod(lead)
    w2 = jnp.ones((n,), x.dtype) if weight is None else compute_dtype(jnp.asarray(weight)).reshape(n)
    return x.reshape(rows, n), w2, lead, k, rows, n


def rms_norm_fwd(x, weight=None, eps=None, normalized_ndim=None):
    """-> (out [x.shape, x.dtype], rstd [lead + (1,)*k, float32])."""
    x = jnp.asarray(x)
    eps = default_eps(x.dtype) if eps is None else eps
    x = compute_dtype(x)
    x2, w2, lead, k, rows, n = _prep(x, weight, normalized_ndim)
    out, rstd = launch(_rms_fwd_kernel, _row_cfg(rows, n), x2, w2, float(eps),
                       estimate=cost(4 * x2.size, 2 * nbytes(x2), rows))
    return out.reshape(x.shape), rstd.reshape(lead + (1,) * k)


def rms_norm_bwd(dy, x, weight, rstd, normalized_ndim=None):
    """-> (dx like x, dweight like weight or None when weight is None)."""
    x = compute_dtype(jnp.asarray(x))
    x2, w2, lead, k, rows, n = _prep(x, weight, normalized_ndim)
    dy2 = compute_dtype(jnp.asarray(dy)).astype(x2.dtype).reshape(rows, n)
    r2 = jnp.asarray(rstd, jnp.float32).reshape(rows, 1)
    dx = launch(_rms_bwd_dx_kernel, _row_cfg(rows, n), dy2, x2, w2, r2,
                estimate=cost(8 * x2.size, 3 * nbytes(x2)))
    dw = None
    if weight is not None:
        dw = _column_sum(_rms_bwd_dw_kernel, dy2, x2, r2)
        dw = dw.reshape(weight.shape).astype(compute_dtype(jnp.asarray(weight)).dtype)
    return dx.reshape(x.shape), dw


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rms_norm(x, weight, eps):
    return rms_norm_fwd(x, weight, eps)[0]


def _rms_norm_f(x, weight, eps):
    out, rstd = rms_norm_fwd(x, weight, eps)
    return out, (x, weight, rstd)


def _rms_norm_b(eps, res, dy):
    x, weight, rstd = res
    dx, dw = rms_norm_bwd(dy, x, weight, rstd)
    return dx.astype(x.dtype), dw.astype(weight.dtype)


_rms_norm.defvjp(_rms_norm_f, _rms_norm_b)


def rms_norm(x, weight=None, eps=None):
    """torch.nn.functional.rms_norm(x, weight.shape, weight, eps); differentiable."""
    x = jnp.asarray(x)
    eps = default_eps(x.dtype) if eps is None else eps
    x = compute_dtype(x)
    if weight is None:
        w = jnp.ones(x.shape[-1:], x.dtype)
        return _rms_norm(x, w, float(eps))
    return _rms_norm(x, compute_dtype(jnp.asarray(weight)), float(eps))
