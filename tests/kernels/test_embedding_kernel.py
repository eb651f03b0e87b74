"""Pallas embedding gather / dense backward (interpret mode) vs the jnp reference and CPU
torch, plus TPU export and VMEM checks."""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tpu_kernels.pallas import embedding as emb
from tpu_kernels.pallas import tpu_info
from helpers import tpu_compile
from tpu_kernels.pallas.reference import embedding as ref
from tpu_kernels.testing import tol

jax.config.update("jax_enable_x64", True)

THOROUGH = os.environ.get("TPU_KERNELS_HYPOTHESIS_PROFILE") == "thorough"
thorough = [pytest.mark.thorough, pytest.mark.skipif(not THOROUGH, reason="thorough sweep")]


@pytest.fixture(autouse=True)
def _few_rows(monkeypatch):
    # The per-row loop is unrolled: 8 rows per step keeps interpret-mode tracing quick.
    monkeypatch.setattr(emb, "_MAX_ROWS", 8)


def _data(num_weights, dim, idx_shape, dtype, seed=0, idx_max=None):
    rng = np.random.default_rng(seed)
    w = jnp.asarray(rng.standard_normal((num_weights, dim)), jnp.float32).astype(dtype)
    idx = rng.integers(0, idx_max or num_weights, idx_shape)      # small range: duplicates
    g = jnp.asarray(rng.standard_normal((*idx_shape, dim)), jnp.float32).astype(dtype)
    return w, idx, g


def _f32(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


@pytest.mark.parametrize("num_weights,dim,idx_shape,dtype,idx_dtype", [
    (50, 200, (7,), jnp.float32, np.int64),
    (64, 256, (3, 11), jnp.float32, np.int32),
    (129, 128, (33,), jnp.bfloat16, np.int64),
])
def test_forward(num_weights, dim, idx_shape, dtype, idx_dtype):
    w, idx, _ = _data(num_weights, dim, idx_shape, dtype)
    got = emb.embedding(w, jnp.asarray(idx.astype(idx_dtype)))
    want = torch.nn.functional.embedding(torch.tensor(idx), torch.tensor(_f32(w)))
    assert got.shape == (*idx_shape, dim) and got.dtype == w.dtype
    np.testing.assert_array_equal(_f32(got), want.numpy())
    np.testing.assert_array_equal(_f32(got), _f32(ref.embedding(w, jnp.asarray(idx))))


@pytest.mark.parametrize("num_weights,dim,idx_shape,dtype,padding_idx,scale", [
    (50, 200, (7,), jnp.float32, -1, False),
    (40, 256, (33,), jnp.float32, 3, False),
    (40, 256, (3, 11), jnp.float32, 5, True),
    (129, 128, (33,), jnp.bfloat16, 2, False),
])
def test_backward(num_weights, dim, idx_shape, dtype, padding_idx, scale):
    w, idx, g = _data(num_weights, dim, idx_shape, dtype, idx_max=9)   # many duplicates
    idx[..., 0] = max(padding_idx, 0)
    tw = torch.tensor(_f32(w), requires_grad=True)
    out = torch.nn.functional.embedding(torch.tensor(idx), tw,
                                        padding_idx=padding_idx if padding_idx >= 0 else None,
                                        scale_grad_by_freq=scale)
    out.backward(torch.tensor(_f32(g)))
    t = tol(dtype, kernel=True)
    got = emb.embedding_dense_backward(g, jnp.asarray(idx), num_weights, padding_idx, scale)
    assert got.shape == (num_weights, dim) and got.dtype == g.dtype
    np.testing.assert_allclose(_f32(got), tw.grad.numpy(), **t)
    r = ref.embedding_dense_backward(g, jnp.asarray(idx), num_weights, padding_idx, scale)
    np.testing.assert_allclose(_f32(got), _f32(r), **t)
    if padding_idx >= 0:
        assert not np.any(_f32(got)[padding_idx])


def test_vjp_through_forward():
    """jax.grad of the forward runs the scatter kernel (default rows per step, one run
    spanning a step boundary)."""
    emb._MAX_ROWS = 32
    w, idx, g = _data(30, 128, (40,), jnp.float32, idx_max=4)
    idx = np.sort(idx)
    _, vjp = jax.vjp(lambda w: emb.embedding(w, jnp.asarray(idx), padding_idx=1), w)
    (dw,) = vjp(g)
    np.testing.assert_allclose(
        _f32(dw), _f32(ref.embedding_dense_backward(g, jnp.asarray(idx), 30, 1)), **tol(jnp.float32, kernel=True))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_compiles_for_tpu(dtype):
    w = jax.ShapeDtypeStruct((1000, 256), dtype)     # 1000 rows: a ragged last bf16 tile
    idx = jax.ShapeDtypeStruct((4, 9), jnp.int32)
    g = jax.ShapeDtypeStruct((4, 9, 256), dtype)
    bwd = functools.partial(emb.embedding_dense_backward, num_weights=1000, padding_idx=0,
                            scale_grad_by_freq=True)
    tpu_compile(lambda w, i, g: (emb.embedding(w, i), bwd(g, i)), w, idx, g, kernels=2)


@pytest.mark.parametrize("gen", tpu_info.CHECKED_GENERATIONS)
@pytest.mark.parametrize("n,dim", [(7, 200), (4096, 1024), (16384, 4096), (8192, 8192), (2048, 16384)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_blocks_fit_vmem(gen, n, dim, dtype):
    emb._MAX_ROWS = 32
    chip = tpu_info.CHIPS[gen]
    rows = emb.rows_per_step(n, dim, dtype)
    assert rows % tpu_info.sublane(dtype) == 0
    assert emb.vmem_bytes(rows, dim, dtype) <= tpu_info.vmem_budget(chip)
    assert emb.supports((32000, dim), dtype, (n,), jnp.int64, chip=chip) is None


def test_supports():
    assert emb.supports((10, 4), "float32", (3,), "int64") is None
    assert "2-D" in emb.supports((10,), "float32", (3,), "int64")
    assert "dtype" in emb.supports((10, 4), "float16", (3,), "int64")
    assert "integers" in emb.supports((10, 4), "float32", (3,), "float32")
    assert "2**31" in emb.supports((2**31, 4), "float32", (3,), "int64")
    assert "SMEM" in emb.supports((10, 4), "float32", (emb.MAX_TOKENS + 1,), "int32")
    assert "empty" in emb.supports((10, 4), "float32", (0,), "int32")
    assert "VMEM" in emb.supports((10, 2**24), "float32", (64,), "int32")
    with pytest.raises(ValueError, match="2\\*\\*31"):
        emb.embedding_dense_backward(jnp.zeros((3, 4), jnp.float32), jnp.zeros((3,), jnp.int32),
                                     2**31)


@pytest.mark.parametrize("mark", [pytest.param(0, marks=thorough)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_backward_big(dtype, mark):
    emb._MAX_ROWS = 32
    w, idx, g = _data(1000, 384, (300,), dtype, idx_max=50)
    got = emb.embedding_dense_backward(g, jnp.asarray(idx), 1000, 7, True)
    r = ref.embedding_dense_backward(g, jnp.asarray(idx), 1000, 7, True)
    np.testing.assert_allclose(_f32(got), _f32(r), **tol(dtype, kernel=True))
