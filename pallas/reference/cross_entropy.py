"""Plain jax.numpy cross entropy with torch.nn.functional.cross_entropy's semantics."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def smoothing(label_smoothing: float) -> float:
    """The smoothing torch applies: its smoothing term runs only when ``label_smoothing >
    0``, so a negative or nan one is none (torch raises for one above 1 before this)."""
    return float(label_smoothing) if label_smoothing > 0 else 0.0


def class_indices(target: jax.Array) -> jax.Array:
    """``target`` as signed ints: compared as uint8, ignore_index -100 would wrap to 156
    and a class iota past 255 would wrap to 0."""
    return target.astype(jnp.int32) if jnp.issubdtype(target.dtype, jnp.unsignedinteger) else target


def _reduce(loss: jax.Array, reduction: str, total: jax.Array) -> jax.Array:
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / total


def cross_entropy(logits: jax.Array, target: jax.Array, weight: jax.Array | None = None, *,
                  ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float | jax.Array = 0.0) -> jax.Array:
    """Loss of ``logits [n, C]`` against class indices ``target [n]`` (f32 math).

    As torch: ``(1 - eps) nll + eps / C smooth``, each term reduced on its own (a mean
    divides both by the target weights' sum), the smoothing term only when eps > 0 (its
    ``0 * inf`` would turn a -inf logit's finite loss into nan). Ignored rows are selected
    away (``where``), not multiplied by 0, so they get a zero gradient even when the mean's
    divisor is 0 (every target ignored). ``label_smoothing`` may be traced (the op's
    lowering traces it): then a ``where`` picks the plain loss for eps <= 0.
    """
    x = logits.astype(jnp.float32)
    n_cls = x.shape[1]
    w = jnp.ones((n_cls,), jnp.float32) if weight is None else weight.astype(jnp.float32)
    logp = jax.nn.log_softmax(x, axis=1)
    target = class_indices(target)
    valid = target != ignore_index
    t = jnp.where(valid, target, 0).astype(jnp.int32)
    total = jnp.where(valid, w[t], 0.0).sum()
    nll = jnp.where(valid, -w[t] * jnp.take_along_axis(logp, t[:, None], axis=1)[:, 0], 0.0)
    loss = _reduce(nll, reduction, total)
    if isinstance(label_smoothing, (int, float)) and smoothing(label_smoothing) == 0:
        return loss.astype(logits.dtype)
    on = jnp.asarray(label_smoothing) > 0
    eps = jnp.where(on, label_smoothing, 0.0).astype(jnp.float32)
    smooth = jnp.where(valid, -(logp * w).sum(axis=1), 0.0)
    mixed = (1.0 - eps) * loss + (eps / n_cls) * _reduce(smooth, reduction, total)
    return jnp.where(on, mixed, loss).astype(logits.dtype)
