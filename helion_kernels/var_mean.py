"""var_mean / var / std over the last dim with Bessel ``correction`` (torch semantics).

One Helion kernel per row tile: two-pass in float32 on the VMEM-resident row (mean,
then the sum of squared deviations), so no catastrophic cancellation. The division by
``max(n - correction, 0)`` happens in the wrapper (0/0 -> nan, x/0 -> inf as in torch).

Public (JAX arrays in/out; results in the input dtype, f64 inputs computed in f32):
    var_mean(x, correction=1, keepdim=False) -> (var, mean)
    var(x, correction=1, keepdim=False) -> var
    std(x, correction=1, keepdim=False) -> std
    supports(shape, dtype, dim=-1) -> None | reason   (dim: int, or a 1-tuple / None for 1-D)
"""
from __future__ import annotations


import jax.numpy as jnp
import torch
import helion.language as hl

from ._common import compute_dtype, cost, dtype_reason, launch, nbytes, row_block, rows_reason

MAX_COLS = 65536


def _moments_kernel(x: torch.Tensor):
    m, n = x.size()
    mean = torch.empty([m, 1], dtype=torch.float32, device=x.device)
    ssq = torch.empty([m, 1], dtype=torch.float32, device=x.device)
    for tm in hl.tile(m):
        xf = x[tm, :].to(torch.float32)
        mu = torch.mean(xf, dim=-1, keepdim=True)
        xc = xf - mu
        mean[tm, :] = mu
        ssq[tm, :] = torch.sum(xc * xc, dim=-1, keepdim=True)
    return mean, ssq


def supports(shape, dtype, dim=-1) -> str | None:
    r = dtype_reason(dtype)
    if r:
        return r
    dims = (dim,) if isinstance(dim, int) else (tuple(dim) if dim is not None else tuple(range(len(shape))))
    return rows_reason(shape, dims, MAX_COLS)


def _moments(x2):
    return launch(_moments_kernel, {"block_sizes": [row_block(*x2.shape)]}, x2,
                  estimate=cost(4 * x2.size, nbytes(x2)))


def var_mean(x, correction: float = 1, keepdim: bool = False):
    x = compute_dtype(jnp.asarray(x))
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    mean, ssq = _moments(x2)
    denom = jnp.float32(max(n - correction, 0))
    var = ssq / denom
    shape = x.shape[:-1] + ((1,) if keepdim else ())
    return var.reshape(shape).astype(x.dtype), mean.reshape(shape).astype(x.dtype)


def var(x, correction: float = 1, keepdim: bool = False):
    return var_mean(x, correction, keepdim)[0]


def std(x, correction: float = 1, keepdim: bool = False):
    x = compute_dtype(jnp.asarray(x))
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    _, ssq = _moments(x2)
    out = jnp.sqrt(ssq / jnp.float32(max(n - correction, 0)))
    shape = x.shape[:-1] + ((1,) if keepdim else ())
    return out.reshape(shape).astype(x.dtype)
