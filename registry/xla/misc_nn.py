"""Remaining nn ops: pairwise distances (cdist, pdist and their backward ops),
segment_reduce, hash_tensor.

Distances take ``p`` as a static value: 0, 1, 2 and inf have their own formulas, as in
torch. Half types compute in float32.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels.registry.context import out_dtype, out_shape
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import float_compute


# -- distances --------------------------------------------------------------------------------
def _norm_of_diff(d: jax.Array, p: float) -> jax.Array:
    """The p-norm over the last axis of pairwise differences ``d``."""
    a = jnp.abs(d)
    if p == 0:
        return jnp.sum(a != 0, axis=-1).astype(d.dtype)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if math.isinf(p):
        return jnp.max(a, axis=-1, initial=0.0)
    return jnp.sum(a ** p, axis=-1) ** (1.0 / p)


def _norm_grad(d: jax.Array, dist: jax.Array, p: float) -> jax.Array:
    """d dist / d x1 for each pair (difference ``d`` over the last axis), 0 where dist is 0."""
    dist = dist[..., None]
    zero = jnp.zeros((), d.dtype)
    if p == 0:
        return jnp.zeros_like(d)
    if p == 1:
        return jnp.sign(d)
    if math.isinf(p):
        return jnp.where(jnp.abs(d) == dist, jnp.sign(d), zero)
    safe = jnp.where(dist == 0, 1.0, dist)
    if p == 2:
        g = d / safe
    else:
        g = jnp.sign(d) * jnp.abs(d) ** (p - 1) / safe ** (p - 1)
        g = jnp.where(d == 0, zero, g) if p < 1 else g
    return jnp.where(dist == 0, zero, g)


def _uses_mm(p: float, rows1: int, rows2: int, compute_mode) -> bool:
    """Torch computes euclidean distances through a matmul for large inputs (or when told)."""
    return p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and (rows1 > 25 or rows2 > 25)))


def _euclidean_by_mm(x1: jax.Array, x2: jax.Array) -> jax.Array:
    n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    prod = jnp.einsum("...pm,...rm->...pr", x1, x2, precision=jax.lax.Precision.HIGHEST)
    return jnp.sqrt(jnp.maximum(n1 - 2 * prod + jnp.swapaxes(n2, -1, -2), 0.0))


@xla("aten::_euclidean_dist")
def euclidean_dist(x1, x2):
    ct = float_compute(out_dtype())
    return _euclidean_by_mm(*_batched(x1.astype(ct), x2.astype(ct)))


def _batched(x1, x2):
    """x1 (..., P, M) and x2 (..., R, M) with their batch dims broadcast together."""
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return (jnp.broadcast_to(x1, batch + x1.shape[-2:]), jnp.broadcast_to(x2, batch + x2.shape[-2:]))


@xla("aten::_cdist_forward", static=("p",))
def cdist_forward(x1, x2, p, compute_mode):
    ct = float_compute(out_dtype())
    x1, x2 = _batched(x1.astype(ct), x2.astype(ct))
    if _uses_mm(p, x1.shape[-2], x2.shape[-2], compute_mode):
        return _euclidean_by_mm(x1, x2)
    return _norm_of_diff(x1[..., :, None, :] - x2[..., None, :, :], p)


@xla("aten::_cdist_backward", static=("p",))
def cdist_backward(grad, x1, x2, p, cdist):
    ct = float_compute(out_dtype())
    x1b, x2b = _batched(x1.astype(ct), x2.astype(ct))
    d = x1b[..., :, None, :] - x2b[..., None, :, :]
    terms = _norm_grad(d, cdist.astype(ct), p) * grad.astype(ct)[..., None]
    # over the broadcast batch dims: torch's autograd sums them down to x1's shape
    return jnp.sum(terms, axis=-2)


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of each pair i < j, in the order pdist lists them."""
    return np.triu_indices(n, k=1)


@xla("aten::_pdist_forward", static=("p",))
def pdist_forward(self, p=2.0):
    ct = float_compute(out_dtype())
    x = self.astype(ct)
    i, j = _pairs(x.shape[0])
    return _norm_of_diff(x[i] - x[j], p)


@xla("aten::_pdist_backward", static=("p",))
def pdist_backward(grad, self, p, pdist):
    ct = float_compute(out_dtype())
    x = self.astype(ct)
    i, j = _pairs(x.shape[0])
    terms = _norm_grad(x[i] - x[j], pdist.astype(ct), p) * grad.astype(ct)[:, None]
    # a pair's term moves x_i one way and x_j the other
    return jnp.zeros_like(x).at[i].add(terms).at[j].add(-terms)


# -- segment_reduce -------------------------------------------------------------------------------------
_SEGMENT = {"sum": jax.ops.segment_sum, "mean": jax.ops.segment_sum, "max": jax.ops.segment_max,
            "min": jax.ops.segment_min, "prod": jax.ops.segment_prod}


def _one_segment_reduce(data, lengths, reduce, initial):
    """Reduce data (N, ...) over segments of the given lengths (S,) along axis 0."""
    n, s = data.shape[0], lengths.shape[0]
    ids = jnp.searchsorted(jnp.cumsum(lengths), jnp.arange(n), side="right")
    out = _SEGMENT[reduce](data, ids, num_segments=s)
    if reduce == "mean":
        count = jnp.bincount(ids, length=s).astype(data.dtype).reshape((s,) + (1,) * (data.ndim - 1))
        total = out if initial is None else out + initial
        out = total / count
        return out if initial is None else jnp.where(count == 0, initial, out)
    if initial is None:
        return out
    combine = {"sum": jnp.add, "prod": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum}[reduce]
    return combine(out, jnp.asarray(initial, data.dtype))


@xla("aten::segment_reduce")
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
                   initial=None):
    x = data.astype(float_compute(out_dtype()))
    if lengths is None:
        lengths = jnp.diff(offsets, axis=-1)
    axis = axis % data.ndim
    if axis == 0:
        return _one_segment_reduce(x, lengths, reduce, initial)
    # lengths is (*data.shape[:axis], segments): one segmentation per leading index
    flat = x.reshape((-1,) + x.shape[axis:])
    per_row = jax.vmap(lambda d, l: _one_segment_reduce(d, l, reduce, initial))
    return per_row(flat, lengths.reshape(-1, lengths.shape[-1])).reshape(out_shape())


# -- hash_tensor ----------------------------------------------------------------------------------------
@xla("aten::hash_tensor")
def hash_tensor(self, dim=(), *, keepdim=False, mode=0):
    """XOR of each element's bits as a 64-bit value (floats as float64, integers as int64)."""
    if jnp.issubdtype(self.dtype, jnp.floating):
        bits = jax.lax.bitcast_convert_type(self.astype(jnp.float64), jnp.uint64)
    else:
        bits = self.astype(jnp.int64).astype(jnp.uint64)
    dims = tuple(d % self.ndim for d in dim) if dim and self.ndim else tuple(range(self.ndim))
    return jax.lax.reduce(bits, np.uint64(0), jax.lax.bitwise_xor, dims).reshape(out_shape())
