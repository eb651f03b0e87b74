"""Factorizations whose outputs are a LAPACK routine's own choices, run by torch's CPU
kernel from inside the program: Bunch-Kaufman LDL^T (``linalg.ldl_factor_ex``, LAPACK's
``sytrf``: its pivots and packed 1x1/2x2 blocks are the op's contract) and its solve.

``jax.pure_callback`` hands the operands to the host and the results back: one device
round trip a call, exact parity with torch's CPU results, and the program still compiles
for a TPU (the callback rides the host transfer; checked on the v5e compile-only
topology). Batches go to the kernel whole (torch's kernels take batch dimensions).
"""
from __future__ import annotations

import jax
import numpy as np
import torch

from tpu_kernels.registry.context import out_dtype, out_shape
from tpu_kernels.registry.decorator import xla


def _on_host(op, n_out: int, *arrays: jax.Array, **kwargs) -> tuple[jax.Array, ...]:
    """``op`` run by torch on the host copies of ``arrays`` (``kwargs`` static)."""
    shapes = tuple(jax.ShapeDtypeStruct(out_shape(i), out_dtype(i)) for i in range(n_out))

    def run(*host: np.ndarray) -> tuple[np.ndarray, ...]:
        out = op(*(torch.from_numpy(np.asarray(a).copy()) for a in host), **kwargs)
        out = out if isinstance(out, tuple) else (out,)
        return tuple(np.asarray(o.contiguous().numpy(), s.dtype).reshape(s.shape) for o, s in zip(out, shapes))
    return jax.pure_callback(run, shapes, *arrays, vmap_method="broadcast_all")


@xla("aten::linalg_ldl_factor_ex", static=("hermitian", "check_errors"))
def linalg_ldl_factor_ex(self, *, hermitian=False, check_errors=False):
    return _on_host(torch.ops.aten.linalg_ldl_factor_ex.default, 3, self, hermitian=hermitian)


@xla("aten::linalg_ldl_solve", static=("hermitian",))
def linalg_ldl_solve(LD, pivots, B, *, hermitian=False):
    return _on_host(torch.ops.aten.linalg_ldl_solve.default, 1, LD, pivots, B, hermitian=hermitian)[0]
