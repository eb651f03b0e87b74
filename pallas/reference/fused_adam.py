"""Plain jax.numpy Adam/AdamW step for one tensor, torch's fused (``_fused_adam(w)_``) math."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, *, lr, beta1, beta2,
              weight_decay, eps, amsgrad=False, maximize=False, adamw=False, grad_scale=None,
              found_inf=None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
    """Updated (param, exp_avg, exp_avg_sq, max_exp_avg_sq); ``step`` already incremented."""
    f = jnp.float32
    p, g, m, v = (a.astype(f) for a in (param, grad, exp_avg, exp_avg_sq))
    if grad_scale is not None:
        g = g / jnp.asarray(grad_scale, f)
    if maximize:
        g = -g
    if adamw:
        p = p * (1 - lr * weight_decay)
    else:
        g = g + weight_decay * p
    m = m + (1 - beta1) * (g - m)
    v = beta2 * v + (1 - beta2) * g * g
    step = jnp.asarray(step, f)
    bc1 = 1 - jnp.asarray(beta1, f) ** step
    bc2_sqrt = jnp.sqrt(1 - jnp.asarray(beta2, f) ** step)
    vmax = None
    if amsgrad:
        vmax = jnp.maximum(max_exp_avg_sq.astype(f), v)
        denom = jnp.sqrt(vmax) / bc2_sqrt + eps
    else:
        denom = jnp.sqrt(v) / bc2_sqrt + eps
    p = p - (lr / bc1) * m / denom
    new = [p, m, v] + ([vmax] if amsgrad else [])
    old = [param, exp_avg, exp_avg_sq] + ([max_exp_avg_sq] if amsgrad else [])
    skip = found_inf is not None and jnp.asarray(found_inf) != 0
    out = [jnp.where(skip, o, n.astype(o.dtype)) for n, o in zip(new, old)]
    return (*out[:3], out[3] if amsgrad else None)
