"""torch.linalg.lstsq: least squares via SVD, with CPU's argument checks and output shapes."""
from __future__ import annotations

import jax.numpy as jnp

from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import scalar_type_name
from tpu_kernels.registry.xla.linalg import _batch_broadcast, _empty, _mH

_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _check(a, b, driver: str | None) -> str:
    """CPU's argument checks (torch has no meta function for lstsq); the driver to use."""
    name = "torch.linalg.lstsq"
    if a.ndim < 2:
        raise RuntimeError(f"{name}: input must have at least 2 dimensions.")
    if b.ndim < 1:
        raise RuntimeError(f"{name}: other must have at least 1 dimension.")
    if a.dtype != b.dtype:
        raise RuntimeError(f"{name}: Expected input and other to have the same dtype, but got input's dtype "
                           f"{scalar_type_name(a.dtype)} and other's dtype {scalar_type_name(b.dtype)}")
    diff = a.ndim - b.ndim
    if not 0 <= diff <= 1:
        raise RuntimeError(f"{name}: input.dim() must be greater or equal to other.dim() and "
                           "(input.dim() - other.dim()) <= 1")
    if b.ndim == 1 or (diff == 1 and b.shape == a.shape[:-1]):
        if a.shape[-2] != b.shape[-1]:
            raise RuntimeError(f"{name}: input.size(-2) should match other.size(-1)")
    elif a.shape[-2] != b.shape[-2]:
        raise RuntimeError(f"{name}: input.size(-2) should match other.size(-2)")
    elif diff == 1:
        # CPU broadcasts such an `other` in its own way (a (5, 2) with a (1, 5, 3) input gives a
        # (5, 3, 2) solution); refuse it rather than answer with another shape
        raise RuntimeError(f"{name}: other of shape {list(b.shape)} has one dimension fewer than input of shape "
                           f"{list(a.shape)} but is not a batch of vectors of shape {list(a.shape[:-1])}; "
                           "give it input's batch dims (other.expand(...)) on the tpu device")
    if driver is not None and driver not in _DRIVERS:
        raise RuntimeError(f"{name}: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    return driver or "gelsy"


@xla("aten::linalg_lstsq.default", data_dependent=True)
def linalg_lstsq(self, b, rcond=None, *, driver=None):
    """Least squares via SVD; torch has no meta function for it, so this runs eagerly and
    shapes its optional outputs as torch's CPU drivers do (default driver: gelsy)."""
    driver = _check(self, b, driver)
    vector = b.ndim == 1 or (b.ndim == self.ndim - 1 and b.shape == self.shape[:-1])
    if vector:
        # CPU solves a batch of vectors as one-column matrices: residuals keep that column
        x, resid, rank, sv = linalg_lstsq(self, b[..., None], rcond, driver=driver)
        return x[..., 0], resid, rank, sv
    m, n = self.shape[-2:]
    real = jnp.finfo(self.dtype).dtype
    a, bb = _batch_broadcast(self, b)
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    eps = jnp.finfo(real).eps * max(m, n) if rcond is None else rcond
    thr = eps * (jnp.max(s, axis=-1, keepdims=True) if s.shape[-1] else 0)
    keep = s > thr
    sinv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(self.dtype)
    x = (_mH(vh) * sinv[..., None, :]) @ (_mH(u) @ bb)
    rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
    full = bool(jnp.all(rank == n))
    if driver != "gelsy" and m > n and full:
        resid = jnp.sum(jnp.abs(a @ x - bb) ** 2, axis=-2).astype(real)
    else:
        resid = _empty(real)
    if driver == "gels":
        return x, resid, _empty(jnp.int64), _empty(real)
    return x, resid, rank, (s if driver in ("gelsd", "gelss") else _empty(real))
