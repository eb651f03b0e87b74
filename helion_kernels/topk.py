"""Top-k over the last dim (values and indices) with ``torch.topk`` inside a Helion kernel.

Helion's Pallas backend lowers ``torch.topk`` to a divide-and-filter top-k; with
``pallas_topk_recall_target=1.0`` (set here) every column is its own bin, so the result
is exact. Its second stage is a bitonic sort for row tiles <= 128 rows, which Pallas
interpret mode cannot run; off TPU the wrapper selects Helion's exact iterative stage
(``HELION_TOPK_STAGE2=iterative`` while the kernel is traced). Indices come out int32
and are cast to int64 by the wrapper (torch's index dtype; JAX x64 is on at runtime).

Public (JAX arrays in/out):
    topk(x, k, dim=-1, largest=True, sorted=True, index_dtype=jnp.int64) -> (values, indices)
    supports(shape, dtype, k, dim=-1, largest=True, sorted=True) -> None | reason
Semantics: values descending (ascending for largest=False); ties -> lowest index first.
Differences from torch (inputs the caller must avoid or accept): NaN is not ranked
above everything as torch does, and a row with fewer than k values above
float32-min reports float32-min / index 0 for the missing slots.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading

import jax.numpy as jnp
import torch
import helion.language as hl

from ._common import compute_dtype, cost, dtype_reason, interpret_mode, launch, nbytes, pad2
from ._common import round_up

MAX_COLS = 32768
MAX_K = 128
ROW_TILE = 16
_env_lock = threading.Lock()


def _topk_kernel(x: torch.Tensor, k: hl.constexpr):
    m, n = x.size()
    vals = torch.empty([m, k], dtype=x.dtype, device=x.device)
    idx = torch.empty([m, k], dtype=torch.int32, device=x.device)
    for tm in hl.tile(m):
        v, i = torch.topk(x[tm, :], k, dim=-1)
        vals[tm, :] = v
        idx[tm, :] = i.to(torch.int32)
    return vals, idx


def supports(shape, dtype, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> str | None:
    r = dtype_reason(dtype)
    if r:
        return r
    if len(shape) == 0:
        return "0-d input"
    if dim not in (-1, len(shape) - 1):
        return f"dim {dim} is not the last dim"
    n = shape[-1]
    if math.prod(shape) == 0:
        return "zero-size input"
    if not 1 <= k <= n:
        return f"k={k} outside [1, {n}]"
    if k > MAX_K:
        return f"k={k} > {MAX_K} (the exact stage unrolls k selection rounds)"
    if n > MAX_COLS:
        return f"row length {n} > {MAX_COLS} (row must fit a VMEM block)"
    return None


@contextlib.contextmanager
def _stage2_env():
    if not interpret_mode():
        yield
        return
    with _env_lock:
        old = os.environ.get("HELION_TOPK_STAGE2")
        os.environ["HELION_TOPK_STAGE2"] = "iterative"
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("HELION_TOPK_STAGE2", None)
            else:
                os.environ["HELION_TOPK_STAGE2"] = old


def topk(x, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, index_dtype=jnp.int64):
    """torch.topk(x, k, dim=-1, largest, sorted) -> (values, indices); always sorted."""
    x = compute_dtype(jnp.asarray(x))
    if dim not in (-1, x.ndim - 1):
        raise ValueError(f"helion topk handles the last dim only (got dim={dim})")
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if not largest:
        x2 = -x2
    rows = x2.shape[0]
    if rows > ROW_TILE and rows % ROW_TILE:
        # whole row tiles: the in-kernel top-k cannot run a partial tile in interpret mode
        x2 = pad2(x2, round_up(rows, ROW_TILE), n)
    with _stage2_env():
        vals, idx = launch(_topk_kernel, {"block_sizes": [ROW_TILE]}, x2, int(k),
                           estimate=cost(x2.size * k, nbytes(x2)),
                           settings={"pallas_topk_recall_target": 1.0})
    vals, idx = vals[:rows], idx[:rows]
    if not largest:
        vals = -vals
    out_shape = x.shape[:-1] + (int(k),)
    return vals.reshape(out_shape), idx.reshape(out_shape).astype(index_dtype)
