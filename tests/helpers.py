"""Test helpers: the library's parity checking (one tolerance table, in tpu_kernels.testing)."""
from torch.utils._python_dispatch import TorchDispatchMode

from tpu_kernels.testing import TOLERANCES, assert_same, check, check_parity, to_cpu, to_tpu, tol  # noqa: F401


class RecordOps(TorchDispatchMode):
    """A dispatch mode that lists the ATen ops run inside it (``.ops``), and runs them."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def torch_f32(a, requires_grad: bool = False):
    """A float32 CPU torch copy of a (possibly bf16-rounded) jax array."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    t = torch.from_numpy(np.asarray(jnp.asarray(a, jnp.float32)).copy())
    return t.requires_grad_(requires_grad)


def tpu_compile(fn, *specs, chip: str = "v7x", kernels: int | None = None):
    """Compile ``fn(*specs)`` for ``chip`` with the real XLA:TPU + Mosaic compiler (libtpu,
    compile-only); the compiler's Summary. ``kernels``: the number of Mosaic kernels the
    program must hold. Skips when libtpu is missing (``make test`` installs it)."""
    import pytest

    from tpu_kernels import aot
    reason = aot.unavailable_reason()
    if reason:
        pytest.skip(reason)
    summary = aot.compile(fn, *specs, chip=chip).summary
    if kernels is not None:
        assert len(summary.kernels) == kernels, summary.format()
    for k in summary.kernels:
        assert k.flops is not None, f"{k.name} declares no pl.CostEstimate"
    return summary
