"""Helion cumsum kernel: parity vs CPU torch (interpret mode), TPU lowering."""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import tpu_compile  # noqa: E402

from tpu_kernels.helion_kernels import cumsum as K  # noqa: E402
from helpers import torch_f32 as _t  # noqa: E402
from tpu_kernels.testing import tol  # noqa: E402



@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(7, 129), (3, 11, 384), (4, 2048)], ids=lambda s: "x".join(map(str, s)))
def test_cumsum_parity(shape, dtype):
    x = jax.random.normal(jax.random.key(0), shape, jnp.float32).astype(dtype)
    y = jax.jit(K.cumsum)(x)
    assert y.dtype == dtype and y.shape == shape
    # reference: f32 prefix sums of the (rounded) inputs, rounded to the output dtype
    ref = torch.cumsum(_t(x), -1).to(torch.bfloat16 if dtype == jnp.bfloat16 else torch.float32)
    torch.testing.assert_close(_t(y), ref.float(), **tol(dtype, kernel=True))


def test_cumsum_ones_exact_and_dtype_arg():
    x = jnp.ones((5, 2048), jnp.float32)
    y = K.cumsum(x)
    np.testing.assert_array_equal(np.asarray(y), np.cumsum(np.ones((5, 2048)), -1))
    yb = K.cumsum(x, dtype=jnp.bfloat16)
    assert yb.dtype == jnp.bfloat16
    y64 = K.cumsum(x.astype(jnp.float64))
    assert y64.dtype == jnp.float32


def test_supports():
    assert K.supports((7, 129), "float32") is None
    assert K.supports((7, 129), jnp.bfloat16, out_dtype=jnp.float32) is None
    assert "last dim" in K.supports((7, 129), jnp.float32, dim=0)
    assert "int64" in K.supports((7, 129), jnp.int64)
    assert "float16" in K.supports((7, 129), jnp.float16)
    assert "row length" in K.supports((2, 32768), jnp.float32)


@pytest.mark.parametrize("shape,dtype", [((7, 129), jnp.float32)],
                         ids=["7x129-f32"])   # bf16 at production shapes: test_real_compile.py
def test_cumsum_compiles_for_tpu(shape, dtype):
    tpu_compile(K.cumsum, jax.ShapeDtypeStruct(shape, dtype), kernels=1)


@pytest.mark.thorough
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 128), (130, 1000), (16, 16384)], ids=lambda s: "x".join(map(str, s)))
def test_cumsum_sweep(shape, dtype):
    test_cumsum_parity(shape, dtype)
