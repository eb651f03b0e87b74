"""Small adapters between torch (meta) arguments and the kernels' jax-typed ``supports``."""
from __future__ import annotations

import torch

from tpu_kernels.registry.dtypes import to_jax_dtype


def jdt(t: torch.Tensor):
    """The jax dtype of a torch tensor."""
    return to_jax_dtype(t.dtype)


