"""Plain jax.numpy cross entropy with torch.nn.functional.cross_entropy's semantics."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy(logits: jax.Array, target: jax.Array, weight: jax.Array | None = None, *,
                  ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> jax.Array:
    """Loss of ``logits [n, C]`` against class indices ``target [n]`` (f32 math)."""
    x = logits.astype(jnp.float32)
    n_cls = x.shape[1]
    w = jnp.ones((n_cls,), jnp.float32) if weight is None else weight.astype(jnp.float32)
    logp = jax.nn.log_softmax(x, axis=1)
    valid = target != ignore_index
    t = jnp.where(valid, target, 0).astype(jnp.int32)
    w_t = jnp.where(valid, w[t], 0.0)
    nll = -w_t * jnp.take_along_axis(logp, t[:, None], axis=1)[:, 0]
    smooth = jnp.where(valid, -(logp * w).sum(axis=1), 0.0)
    loss = (1.0 - label_smoothing) * nll + (label_smoothing / n_cls) * smooth
    if reduction == "none":
        return loss.astype(logits.dtype)
    if reduction == "sum":
        return loss.sum().astype(logits.dtype)
    return (loss.sum() / w_t.sum()).astype(logits.dtype)
