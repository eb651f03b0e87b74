"""Plain jax.numpy references for ``pallas/matmul.py``."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def matmul(a: jax.Array, b: jax.Array, bias: jax.Array | None = None, *,
           beta: float = 1.0, alpha: float = 1.0) -> jax.Array:
    """``beta * bias + alpha * (a @ b)`` in f32, cast to ``a.dtype``; a, b 2-D or 3-D."""
    out = alpha * jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32),
                             precision=jax.lax.Precision.HIGHEST)
    if bias is not None:
        out = out + beta * bias.astype(jnp.float32)
    return out.astype(a.dtype)
