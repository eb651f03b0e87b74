"""Plain jax.numpy linear + cross entropy: materialises the full [n, vocab] logits."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tpu_kernels.pallas.reference.cross_entropy import cross_entropy


def linear_cross_entropy(hidden: jax.Array, weight: jax.Array, target: jax.Array, *,
                         ignore_index: int = -100, reduction: str = "mean",
                         label_smoothing: float = 0.0) -> jax.Array:
    """cross_entropy(hidden @ weight.T, target) with f32 logits."""
    logits = jnp.dot(hidden, weight.T, preferred_element_type=jnp.float32)
    loss = cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction,
                         label_smoothing=label_smoothing)
    return loss.astype(hidden.dtype)
