"""Test helpers: the library's parity checking (one tolerance table, in tpu_kernels.testing)."""
from tpu_kernels.testing import TOLERANCES, assert_same, check, check_parity, to_cpu, to_tpu, tol  # noqa: F401


def torch_f32(a, requires_grad: bool = False):
    """A float32 CPU torch copy of a (possibly bf16-rounded) jax array."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    t = torch.from_numpy(np.asarray(jnp.asarray(a, jnp.float32)).copy())
    return t.requires_grad_(requires_grad)
