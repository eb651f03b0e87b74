"""Small adapters between torch (meta) arguments and the kernels' jax-typed ``supports``."""
from __future__ import annotations

import jax
import torch

from tpu_kernels.registry.dtypes import to_jax_dtype

_PRECISION = {"highest": jax.lax.Precision.HIGHEST, "high": jax.lax.Precision.HIGH,
              "medium": jax.lax.Precision.DEFAULT}


def jdt(t: torch.Tensor):
    """The jax dtype of a torch tensor."""
    return to_jax_dtype(t.dtype)


def matmul_precision() -> jax.lax.Precision:
    """``torch.get_float32_matmul_precision()`` as a jax precision (read at trace time)."""
    return _PRECISION[torch.get_float32_matmul_precision()]
