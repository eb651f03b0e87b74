"""Helion var_mean / var / std kernel: parity vs CPU torch (interpret mode), TPU lowering."""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import tpu_compile  # noqa: E402

from tpu_kernels.helion_kernels import var_mean as K  # noqa: E402
from helpers import torch_f32 as _t  # noqa: E402
from tpu_kernels.testing import tol  # noqa: E402



@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(7, 129), (3, 11, 384)], ids=lambda s: "x".join(map(str, s)))
def test_var_mean_parity(shape, dtype, correction):
    x = (jax.random.normal(jax.random.key(0), shape, jnp.float32) * 3 + 100).astype(dtype)
    v, m = jax.jit(lambda a: K.var_mean(a, correction))(x)
    assert v.dtype == m.dtype == dtype and v.shape == shape[:-1]
    rv, rm = torch.var_mean(_t(x), -1, correction=correction)
    torch.testing.assert_close(_t(v), rv, **tol(dtype, kernel=True))
    torch.testing.assert_close(_t(m), rm, **tol(dtype, kernel=True))
    s = K.std(x, correction, keepdim=True)
    assert s.shape == shape[:-1] + (1,)
    torch.testing.assert_close(_t(s), torch.std(_t(x), -1, correction=correction, keepdim=True), **tol(dtype, kernel=True))
    torch.testing.assert_close(_t(K.var(x, correction)), rv, **tol(dtype, kernel=True))


@pytest.mark.filterwarnings("ignore:var_mean")
def test_var_single_element_rows_nan_like_torch():
    x = jnp.ones((4, 1), jnp.float32)
    v, m = K.var_mean(x, 1)
    rv, rm = torch.var_mean(_t(x), -1, correction=1)
    torch.testing.assert_close(_t(v), rv, equal_nan=True)


def test_supports():
    assert K.supports((7, 129), "float32") is None
    assert K.supports((7, 129), jnp.float64) is None
    assert K.supports((129,), jnp.float32, dim=None) is None
    assert "last dim" in K.supports((7, 129), jnp.float32, dim=0)
    assert "last dim" in K.supports((7, 129), jnp.float32, dim=(0, 1))
    assert "float16" in K.supports((7, 129), jnp.float16)
    assert "row length" in K.supports((2, 1 << 17), jnp.float32)


@pytest.mark.parametrize("shape,dtype", [((7, 129), jnp.float32)],
                         ids=["7x129-f32"])   # bf16 at production shapes: test_real_compile.py
def test_var_mean_compiles_for_tpu(shape, dtype):
    tpu_compile(lambda a: K.var_mean(a, 1), jax.ShapeDtypeStruct(shape, dtype), kernels=1)


@pytest.mark.thorough
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 128), (130, 1000), (64, 8192)], ids=lambda s: "x".join(map(str, s)))
def test_var_mean_sweep(shape, dtype):
    test_var_mean_parity(shape, dtype, 1)
