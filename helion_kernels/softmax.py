"""Softmax and log-softmax over the last dim, forward and backward.

Rows up to ``LONG_ROW`` columns are held whole in one block (one pass). Longer rows
(vocab-sized, e.g. 32k-256k) loop over column tiles: pass 1 keeps an online running
max and rescaled sum, pass 2 writes the normalised values; the backward does the same
with a running ``sum(dy*y)`` / ``sum(dy)``. Looped kernels need whole column tiles, so
the wrapper pads an unaligned long row (with -inf / 0, which contribute nothing).

Public (JAX arrays in/out):
    softmax(x, dim=-1) / log_softmax(x, dim=-1)            (custom_vjp)
    softmax_fwd(x, log=False, block_cols=None) -> y
    softmax_bwd(dy, y, log=False, block_cols=None) -> dx   (aten._softmax_backward_data /
                                                            _log_softmax_backward_data)
    supports(shape, dtype, dim=-1) -> None | reason
``block_cols`` forces the looped (long-row) path with that column tile (tests).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
import helion.language as hl

from ._common import compute_dtype, cost, dtype_reason, launch, nbytes, pad2, round_up, row_block
from ._common import rows_reason

LONG_ROW = 16384          # longer rows use the column-tiled kernels
LOOP_COL_TILE = 2048      # column tile of the looped kernels
LOOP_ROW_TILE = 16


# ------------------------------------------------------------------ one-pass kernels

def _softmax_row_kernel(x: torch.Tensor, log: hl.constexpr):
    m, n = x.size()
    y = torch.empty_like(x)
    for tm in hl.tile(m):
        v = x[tm, :].to(torch.float32)
        mx = torch.amax(v, dim=-1, keepdim=True)
        sh = v - mx
        e = torch.exp(sh)
        s = torch.sum(e, dim=-1, keepdim=True)
        if log:
            y[tm, :] = (sh - torch.log(s)).to(y.dtype)
        else:
            y[tm, :] = (e / s).to(y.dtype)
    return y


def _softmax_bwd_row_kernel(dy: torch.Tensor, y: torch.Tensor, log: hl.constexpr):
    m, n = y.size()
    dx = torch.empty_like(y)
    for tm in hl.tile(m):
        g = dy[tm, :].to(torch.float32)
        yv = y[tm, :].to(torch.float32)
        if log:
            s = torch.sum(g, dim=-1, keepdim=True)
            dx[tm, :] = (g - torch.exp(yv) * s).to(dx.dtype)
        else:
            s = torch.sum(g * yv, dim=-1, keepdim=True)
            dx[tm, :] = (yv * (g - s)).to(dx.dtype)
    return dx


# ------------------------------------------------------------------ looped kernels

def _softmax_loop_kernel(x: torch.Tensor, log: hl.constexpr):
    m, n = x.size()
    y = torch.empty_like(x)
    for tm in hl.tile(m):
        run_max = hl.full([tm, 1], float("-inf"), dtype=torch.float32)
        run_sum = hl.zeros([tm, 1], dtype=torch.float32)
        for tn in hl.tile(n):
            v = x[tm, tn].to(torch.float32)
            new_max = torch.maximum(run_max, torch.amax(v, dim=-1, keepdim=True))
            run_sum = run_sum * torch.exp(run_max - new_max) + torch.sum(
                torch.exp(v - new_max), dim=-1, keepdim=True)
            run_max = new_max
        for tn in hl.tile(n):
            v = x[tm, tn].to(torch.float32)
            if log:
                y[tm, tn] = (v - run_max - torch.log(run_sum)).to(y.dtype)
            else:
                y[tm, tn] = (torch.exp(v - run_max) / run_sum).to(y.dtype)
    return y


def _softmax_bwd_loop_kernel(dy: torch.Tensor, y: torch.Tensor, log: hl.constexpr):
    m, n = y.size()
    dx = torch.empty_like(y)
    for tm in hl.tile(m):
        acc = hl.zeros([tm, 1], dtype=torch.float32)
        for tn in hl.tile(n):
            g = dy[tm, tn].to(torch.float32)
            if log:
                acc = acc + torch.sum(g, dim=-1, keepdim=True)
            else:
                acc = acc + torch.sum(g * y[tm, tn].to(torch.float32), dim=-1, keepdim=True)
        for tn in hl.tile(n):
            g = dy[tm, tn].to(torch.float32)
            yv = y[tm, tn].to(torch.float32)
            if log:
                dx[tm, tn] = (g - torch.exp(yv) * acc).to(dx.dtype)
            else:
                dx[tm, tn] = (yv * (g - acc)).to(dx.dtype)
    return dx


# ------------------------------------------------------------------ checks

def supports(shape, dtype, dim: int = -1) -> str | None:
    r = dtype_reason(dtype)
    if r:
        return r
    return rows_reason(shape, (dim,))


# ------------------------------------------------------------------ wrappers

def _as_rows(x):
    x = compute_dtype(jnp.asarray(x))
    n = x.shape[-1] if x.ndim else 1
    return x, x.reshape(-1, n)


def _loop_tiles(rows: int, n: int, block_cols: int | None):
    bn = block_cols or LOOP_COL_TILE
    return LOOP_ROW_TILE, bn, round_up(n, bn)


def softmax_fwd(x, log: bool = False, block_cols: int | None = None):
    x, x2 = _as_rows(x)
    rows, n = x2.shape
    if block_cols is None and n <= LONG_ROW:
        y = launch(_softmax_row_kernel, {"block_sizes": [row_block(rows, n)]}, x2, bool(log),
                   estimate=cost(5 * x2.size, 2 * nbytes(x2), x2.size))
    else:
        bm, bn, np_ = _loop_tiles(rows, n, block_cols)
        cfg = {"block_sizes": [bm, bn, bn], "pallas_loop_type": "fori_loop"}
        y = launch(_softmax_loop_kernel, cfg, pad2(x2, rows, np_, -jnp.inf), bool(log),
                   estimate=cost(8 * rows * np_, 3 * nbytes(x2), 2 * rows * np_))[:, :n]
    return y.reshape(x.shape)


def softmax_bwd(dy, y, log: bool = False, block_cols: int | None = None):
    y, y2 = _as_rows(y)
    dy2 = compute_dtype(jnp.asarray(dy)).astype(y.dtype).reshape(y2.shape)
    rows, n = y2.shape
    if block_cols is None and n <= LONG_ROW:
        dx = launch(_softmax_bwd_row_kernel, {"block_sizes": [row_block(rows, n)]}, dy2, y2,
                    bool(log), estimate=cost(4 * y2.size, 3 * nbytes(y2), y2.size if log else 0))
    else:
        bm, bn, np_ = _loop_tiles(rows, n, block_cols)
        cfg = {"block_sizes": [bm, bn, bn], "pallas_loop_type": "fori_loop"}
        ypad = pad2(y2, rows, np_, -jnp.inf if log else 0)
        dx = launch(_softmax_bwd_loop_kernel, cfg, pad2(dy2, rows, np_), ypad, bool(log),
                    estimate=cost(6 * rows * np_, 5 * nbytes(y2), rows * np_ if log else 0))[:, :n]
    return dx.reshape(y.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _softmax(x, log, block_cols):
    return softmax_fwd(x, log, block_cols)


def _softmax_f(x, log, block_cols):
    y = softmax_fwd(x, log, block_cols)
    return y, y


def _softmax_b(log, block_cols, y, dy):
    return (softmax_bwd(dy, y, log, block_cols),)


_softmax.defvjp(_softmax_f, _softmax_b)


def _check_dim(x, dim):
    if dim not in (-1, x.ndim - 1):
        raise ValueError(f"helion softmax handles the last dim only (got dim={dim})")


def softmax(x, dim: int = -1, block_cols: int | None = None):
    """torch.softmax(x, dim) for the last dim; differentiable."""
    x = compute_dtype(jnp.asarray(x))
    _check_dim(x, dim)
    return _softmax(x, False, block_cols)


def log_softmax(x, dim: int = -1, block_cols: int | None = None):
    """torch.log_softmax(x, dim) for the last dim; differentiable."""
    x = compute_dtype(jnp.asarray(x))
    _check_dim(x, dim)
    return _softmax(x, True, block_cols)
