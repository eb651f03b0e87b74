"""Helion topk kernel (exact, torch.topk inside Helion): parity vs CPU torch, TPU lowering."""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import tpu_compile  # noqa: E402

from tpu_kernels.helion_kernels import topk as K  # noqa: E402


def _distinct(seed, shape, dtype):
    """Distinct values per row so the index order is unambiguous."""
    n = int(np.prod(shape))
    vals = np.random.default_rng(seed).permutation(n).reshape(shape)
    return jnp.asarray(vals, jnp.float32).astype(dtype)


@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape,k", [((7, 129), 5), ((3, 11, 128), 8)], ids=["7x129-k5", "3x11x128-k8"])
def test_topk_parity(shape, k, dtype, largest):
    x = _distinct(0, shape, jnp.float32)
    if dtype == jnp.bfloat16:      # keep values exactly representable and distinct per row
        x = jnp.argsort(jnp.argsort(x, -1), -1).astype(jnp.bfloat16)
    v, i = jax.jit(lambda a: K.topk(a, k, largest=largest))(x)
    assert v.dtype == dtype and i.dtype == jnp.int64 and v.shape == shape[:-1] + (k,)
    rv, ri = torch.topk(torch.from_numpy(np.array(x.astype(jnp.float32))), k, largest=largest)
    np.testing.assert_array_equal(np.asarray(v.astype(jnp.float32)), rv.numpy())
    np.testing.assert_array_equal(np.asarray(i), ri.numpy())


def test_topk_f64_input():
    x = _distinct(1, (4, 200), jnp.float32).astype(jnp.float64)
    v, i = K.topk(x, 3)
    assert v.dtype == jnp.float32
    rv, ri = torch.topk(torch.from_numpy(np.array(x)), 3)
    np.testing.assert_array_equal(np.asarray(i), ri.numpy())


def test_supports():
    assert K.supports((7, 129), "float32", 5) is None
    assert "last dim" in K.supports((7, 129), jnp.float32, 5, dim=0)
    assert "k=0" in K.supports((7, 129), jnp.float32, 0)
    assert "k=200" in K.supports((7, 129), jnp.float32, 200)
    assert "k=256" in K.supports((7, 1024), jnp.float32, 256)
    assert "int32" in K.supports((7, 129), jnp.int32, 5)
    assert "row length" in K.supports((2, 1 << 16), jnp.float32, 5)


@pytest.mark.parametrize("shape,dtype,k", [((7, 129), jnp.float32, 5)],
                         ids=["7x129-f32-k5"])   # bf16 at production shapes: test_real_compile.py
def test_topk_compiles_for_tpu(shape, dtype, k):
    tpu_compile(lambda a: K.topk(a, k), jax.ShapeDtypeStruct(shape, dtype), kernels=1)


@pytest.mark.thorough
@pytest.mark.parametrize("shape,k", [((130, 1000), 16), ((4, 32000), 50)], ids=["130x1000", "4x32000"])
def test_topk_sweep(shape, k):
    test_topk_parity(shape, k, jnp.float32, True)
