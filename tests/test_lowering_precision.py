"""Dots a lowering makes without naming a precision (``a @ b``, jnp.linalg's own) take
torch's float32 matmul precision: JAX's default on a TPU is one bfloat16 pass, so an
unnamed dot in a float32 lowering (``registry/xla/linalg.py``'s SVD-based pinv and lstsq,
LU's reconstruction) was computed in bfloat16 there. Read from the StableHLO a TPU compile takes (libtpu honours it:
``operand_precision={highest,highest}`` on the TPU program's convolutions)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch

from tpu_kernels.registry.context import Call, lowering


def _precisions(precision: str) -> list[str]:
    def f(a, b):
        with lowering(Call(())):
            return a @ b, jnp.einsum("ij,jk->ik", a, b), jnp.dot(a, b)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        s = jax.ShapeDtypeStruct((8, 8), jnp.float32)
        text = jax.jit(f).lower(s, s).as_text()
    finally:
        torch.set_float32_matmul_precision(old)
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert len(dots) == 3, text
    return dots


@pytest.mark.parametrize("torch_setting, hlo", [("highest", "HIGHEST"), ("high", "HIGH")])
def test_unnamed_dots_take_torch_matmul_precision(torch_setting, hlo):
    dots = _precisions(torch_setting)
    assert all(f"precision = [{hlo}, {hlo}]" in d for d in dots), dots


def test_medium_leaves_them_to_the_chip():
    dots = _precisions("medium")
    assert not any("HIGH" in d for d in dots), dots
