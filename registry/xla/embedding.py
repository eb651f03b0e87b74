"""Embedding lowerings: embedding, embedding_dense_backward, embedding_renorm_ (``max_norm``),
_embedding_bag and its backwards, one_hot.

Out-of-range indices follow ``_index.py``: reads fill 0, writes drop, a deferred check raises as torch.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tpu_kernels.registry.context import check, out_dtype, out_shape
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._index import in_range, read
from tpu_kernels.registry.xla._util import float_compute


@xla("aten::embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    in_range(indices, weight.shape[0], "index out of range in self")
    return jnp.take(weight, indices, axis=0, mode="fill", fill_value=0)


@xla("aten::embedding_renorm_", static=("norm_type",))
def embedding_renorm_(self, indices, max_norm, norm_type):
    """``nn.Embedding(max_norm=...)``: each row ``indices`` names whose ``norm_type``-norm
    exceeds ``max_norm`` is scaled to ``max_norm`` (over ``norm + 1e-7``, as torch), in place."""
    acc = float_compute(self.dtype)
    w = self.astype(acc)
    named = jnp.zeros(self.shape[0], bool).at[indices.reshape(-1)].set(True, mode="drop")
    norm = jnp.linalg.vector_norm(w, ord=norm_type, axis=1)
    scale = jnp.where(named & (norm > max_norm), max_norm / (norm + 1e-7), 1)
    return (w * scale[:, None]).astype(self.dtype)


@xla("aten::embedding_dense_backward")
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """Scatter-add of the output gradient rows into the weight rows they came from."""
    acc = float_compute(grad_output.dtype)
    idx = indices.reshape(-1)
    g = grad_output.reshape((idx.shape[0], -1)).astype(acc)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), acc).at[idx].add(1, mode="drop")
        g = g / read(counts, idx)[:, None]
    keep = (idx != padding_idx) if padding_idx >= 0 else jnp.ones_like(idx, jnp.bool_)
    g = jnp.where(keep[:, None], g, 0)
    out = jnp.zeros((num_weights, g.shape[1]), acc).at[idx].add(g, mode="drop")
    return out.reshape(out_shape()).astype(out_dtype())


@xla("aten::_embedding_bag", "aten::_embedding_bag_forward_only")
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Bags of embedding rows reduced by sum (0), mean (1) or max (2).

    Returns (output, offset2bag, bag_size, max_indices) with the shapes of torch's meta
    function; values as the CPU kernel (bag_size is 0 in sum mode, as there)."""
    n = indices.shape[0]
    _check_bags(weight.shape[0], indices, offsets, padding_idx)
    starts = offsets[:-1] if include_last_offset else offsets
    bags = starts.shape[0]
    pos = jnp.arange(n)
    bag = jnp.searchsorted(starts, pos, side="right") - 1        # last bag starting at or before
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones((n,), jnp.bool_)
    acc = float_compute(weight.dtype)
    rows = jnp.take(weight, indices, axis=0, mode="fill", fill_value=0).astype(acc)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(acc)[:, None]
    count = jax.ops.segment_sum(valid.astype(jnp.int64), bag, bags)
    dt = out_dtype(0)
    # with include_last_offset the meta function gives bag_size one entry per offset
    sizes = jnp.pad(count, (0, out_shape(2)[0] - bags))
    if mode == 2:
        masked = jnp.where(valid[:, None], rows, -jnp.inf)
        top = jax.ops.segment_max(masked, bag, bags)
        first = jax.ops.segment_min(jnp.where((masked == top[bag]) & valid[:, None], pos[:, None], n), bag, bags)
        max_idx = jnp.where(count[:, None] > 0, read(indices, first), 0)
        out = jnp.where(count[:, None] > 0, top, 0)
        return out.astype(dt), bag, sizes, max_idx
    out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), bag, bags)
    if mode == 1:
        out = out / jnp.maximum(count, 1)[:, None].astype(acc)
    bag_size = sizes if mode == 1 else jnp.zeros_like(sizes)
    return out.astype(dt), bag, bag_size, jnp.zeros(out_shape(3), jnp.int64)


def _check_bags(rows: int, indices: jax.Array, offsets: jax.Array, padding_idx: int) -> None:
    """torch's checks of a bag layout (deferred; XLA would read zeros or misplace bags): the
    indices name rows, the first bag starts at 0, the last offset is within the input."""
    in_range(jnp.where(indices == padding_idx, 0, indices) if padding_idx >= 0 else indices, rows,
             "embedding_bag: Index of input not in the valid range", exc=RuntimeError)
    if offsets.shape[0]:
        check(offsets[0] == 0, "offsets[0] has to be 0, i.e., the first sequence in the mini-batch "
              "has to start from position 0", RuntimeError)
        check(offsets[-1] <= indices.shape[0], "offsets[-1] can not be greater than input's length "
              f"{indices.shape[0]}", RuntimeError)


def _dense_only(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None, padding_idx=-1):
    return "sparse=True: the tpu device has no sparse tensors" if sparse else None


@xla("aten::_embedding_bag_backward", supports=_dense_only)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
                           padding_idx=-1):
    """The weight's gradient of ``_embedding_bag`` (dense; CPU's kernel for the same)."""
    return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                        scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@xla("aten::_embedding_bag_dense_backward")
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                 scale_grad_by_freq=False, mode=0, per_sample_weights=None, padding_idx=-1):
    """Each bag's output gradient goes back to the rows it came from: every index of the
    bag (sum; mean divides by the bag's size; per-sample weights scale) or, in max mode,
    the row that won each column. Padding rows get none."""
    acc = float_compute(grad.dtype)
    g = grad.astype(acc)
    cols = g.shape[1]
    if mode == 2:   # max: bags with no row (size 0) gave nothing
        live = (bag_size[:g.shape[0]] > 0)[:, None]
        idx = jnp.where(live, maximum_indices, num_weights)          # num_weights: dropped
        out = jnp.zeros((num_weights, cols), acc).at[idx, jnp.arange(cols)[None, :]].add(g, mode="drop")
        return out.astype(out_dtype())
    rows = read(g, offset2bag)
    if mode == 1:
        rows = rows / jnp.maximum(read(bag_size, offset2bag), 1)[:, None].astype(acc)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(acc)[:, None]
    # each index's row of gradient, from here on as nn.Embedding's backward (frequency
    # scaling, padding rows, the scatter-add)
    return embedding_dense_backward(rows, indices, num_weights, padding_idx, scale_grad_by_freq)


def _sum_only(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    return None if mode == 0 else "per_sample_weights only supported for mode='sum' (torch's CPU kernel's error)"


@xla("aten::_embedding_bag_per_sample_weights_backward", supports=_sum_only)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    """d(output)/d(per_sample_weights), sum mode: each index's row dotted with its bag's
    output gradient (0 for padding rows)."""
    acc = float_compute(grad.dtype)
    rows = jnp.take(weight, indices, axis=0, mode="fill", fill_value=0).astype(acc)
    dots = jnp.sum(rows * read(grad.astype(acc), offset2bag), axis=1)
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, jnp.bool_)
    return jnp.where(keep, dots, 0).astype(out_dtype())


def _static_classes(self, num_classes=-1):
    return None if num_classes >= 0 else "num_classes=-1: the class count depends on the values (decomposed)"


# one_hot is decomposed above the device in plain eager and compiled graphs; inference mode
# (autograd's keys off) hands it over whole
@xla("aten::one_hot", static=("num_classes",), supports=_static_classes)
def one_hot(self, num_classes=-1):
    check(self >= 0, "Class values must be non-negative.", RuntimeError)
    check(self < num_classes, "Class values must be smaller than num_classes.", RuntimeError)
    return (self[..., None] == jnp.arange(num_classes, dtype=self.dtype)).astype(jnp.int64)
