"""torch <-> jax dtype mapping (JAX runs with x64 on, so int64/float64 are real)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

_T2J = {
    torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16, torch.int8: jnp.int8, torch.int16: jnp.int16,
    torch.int32: jnp.int32, torch.int64: jnp.int64, torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16, torch.uint32: jnp.uint32, torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_, torch.complex64: jnp.complex64, torch.complex128: jnp.complex128,
}
_J2T = {np.dtype(v): k for k, v in _T2J.items()}


def to_jax_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return np.dtype(_T2J[dtype])
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no JAX equivalent on the tpu device") from None


def to_torch_dtype(dtype) -> torch.dtype:
    try:
        return _J2T[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"JAX dtype {dtype} has no torch equivalent") from None

