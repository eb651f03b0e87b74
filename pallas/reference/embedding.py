"""Plain jax.numpy embedding lookup and its dense backward (aten semantics)."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def embedding(weight: jax.Array, indices: jax.Array) -> jax.Array:
    """``weight[indices]``: [..., dim]."""
    return jnp.take(weight, indices.astype(jnp.int32), axis=0)


def embedding_dense_backward(grad_output: jax.Array, indices: jax.Array, num_weights: int,
                             padding_idx: int = -1,
                             scale_grad_by_freq: bool = False) -> jax.Array:
    """Scatter-add of grad rows into [num_weights, dim]; duplicates add up, the
    ``padding_idx`` row (``-1``: none) stays zero, optional 1/count scaling."""
    dim = grad_output.shape[-1]
    g = grad_output.reshape(-1, dim).astype(jnp.float32)
    idx = indices.reshape(-1).astype(jnp.int32)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), jnp.float32).at[idx].add(1.0)
        g = g / counts[idx][:, None]
    g = jnp.where((idx == padding_idx)[:, None], 0.0, g)
    out = jnp.zeros((num_weights, dim), jnp.float32).at[idx].add(g)
    return out.astype(grad_output.dtype)
