"""The ops ``torch.amp.GradScaler`` runs on the device: unscale gradients while checking
them for inf/NaN, and grow or back off the loss scale (torch's CUDA kernels' semantics)."""
from __future__ import annotations

import jax.numpy as jnp

from tpu_kernels.registry.decorator import xla


@xla("aten::_amp_foreach_non_finite_check_and_unscale_")
def amp_foreach_non_finite_check_and_unscale_(self, found_inf, inv_scale):
    """Each grad times ``inv_scale``; ``found_inf`` becomes 1 if any grad has an inf/NaN
    (it is never reset to 0 here, as in torch). Mutated args: the grads, then found_inf."""
    bad = found_inf.reshape(())
    out = []
    for g in self:
        bad = jnp.maximum(bad, (~jnp.all(jnp.isfinite(g))).astype(found_inf.dtype))
        out.append((g.astype(jnp.float32) * inv_scale.reshape(())).astype(g.dtype))
    return out, bad.reshape(found_inf.shape)


@xla("aten::_amp_update_scale_", static=("growth_interval",))
def amp_update_scale_(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                      growth_interval):
    """After an overflow: scale *= backoff, tracker = 0; else tracker += 1 and, every
    ``growth_interval`` clean steps, scale *= growth (if still finite), tracker = 0."""
    overflow = found_inf.reshape(()) > 0
    grown = growth_tracker + 1
    grow = grown == growth_interval
    grown_scale = self * scale_growth_factor
    scale = jnp.where(overflow, self * scale_backoff_factor,
                      jnp.where(grow & jnp.isfinite(grown_scale), grown_scale, self))
    tracker = jnp.where(overflow | grow, jnp.zeros_like(growth_tracker), grown)
    return scale.astype(self.dtype), tracker.astype(growth_tracker.dtype)
