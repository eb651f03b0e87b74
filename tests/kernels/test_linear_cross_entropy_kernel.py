"""Fused linear cross entropy (interpret mode) vs the jnp reference and CPU torch
(linear + cross_entropy), plus TPU export, VMEM and memory-figure checks."""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tpu_kernels.pallas import linear_cross_entropy as lce
from tpu_kernels.pallas import tpu_info
from helpers import tpu_compile
from tpu_kernels.pallas.reference import linear_cross_entropy as ref
from tpu_kernels.testing import tol

jax.config.update("jax_enable_x64", True)

THOROUGH = os.environ.get("TPU_KERNELS_HYPOTHESIS_PROFILE") == "thorough"
thorough = [pytest.mark.thorough, pytest.mark.skipif(not THOROUGH, reason="thorough sweep")]


def _f32(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


def _check(n, h, vocab, dtype, chunk=None, **kw):
    rng = np.random.default_rng(0)
    hid = jnp.asarray(rng.standard_normal((n, h)), jnp.float32).astype(dtype)
    w = jnp.asarray(rng.standard_normal((vocab, h)) * 0.2, jnp.float32).astype(dtype)
    t = rng.integers(0, vocab, n)
    t[::4] = kw.get("ignore_index", -100)
    loss, vjp = jax.vjp(lambda a, b: lce.linear_cross_entropy(a, b, jnp.asarray(t), chunk=chunk,
                                                              **kw), hid, w)
    cot = np.linspace(0.5, 1.5, loss.size).reshape(loss.shape).astype(np.float32)
    dh, dw = vjp(jnp.asarray(cot, loss.dtype))
    assert loss.dtype == dh.dtype == dw.dtype == jnp.dtype(dtype)
    th = torch.tensor(_f32(hid), requires_grad=True)
    tw = torch.tensor(_f32(w), requires_grad=True)
    want = torch.nn.functional.cross_entropy(th @ tw.T, torch.tensor(t), **kw)
    want.backward(torch.tensor(cot))
    close = tol(dtype, kernel=True)
    np.testing.assert_allclose(_f32(loss), want.detach().numpy(), **close)
    np.testing.assert_allclose(_f32(dh), th.grad.numpy(), **close)
    np.testing.assert_allclose(_f32(dw), tw.grad.numpy(), **close)
    r = ref.linear_cross_entropy(hid, w, jnp.asarray(t), **kw)
    np.testing.assert_allclose(_f32(loss), _f32(r), **close)


@pytest.mark.parametrize("n,h,vocab,dtype,chunk,kw", [
    (7, 64, 129, jnp.float32, None, dict(reduction="mean")),
    (33, 128, 300, jnp.float32, 128, dict(reduction="sum", label_smoothing=0.1)),
    (20, 72, 1100, jnp.float32, 512, dict(reduction="none", ignore_index=3)),
    (33, 128, 300, jnp.bfloat16, 256, dict(reduction="mean", label_smoothing=0.2)),
])
def test_parity(n, h, vocab, dtype, chunk, kw):
    _check(n, h, vocab, dtype, chunk, **kw)


def test_ragged_blocks(monkeypatch):
    """Several row and vocab blocks, ragged in both (masked rows/columns), and a chunk that
    is not a multiple of the vocab block."""
    monkeypatch.setattr(lce, "_BWD_ROW_BLOCK", 16)
    monkeypatch.setattr(lce, "_VOCAB_BLOCK", 128)
    _check(40, 128, 330, jnp.float32, 200, label_smoothing=0.1)


@pytest.mark.parametrize("dtype", [jnp.float32])   # bf16: test_real_compile
def test_compiles_for_tpu(dtype):
    hid = jax.ShapeDtypeStruct((33, 2048), dtype)
    w = jax.ShapeDtypeStruct((1000, 2048), dtype)
    t = jax.ShapeDtypeStruct((33,), jnp.int32)
    fn = functools.partial(lce.linear_cross_entropy, label_smoothing=0.1, chunk=512)

    def loss_and_grads(hid, w, t):
        loss = lambda a, b: fn(a, b, t).astype(jnp.float32)  # noqa: E731
        return jax.value_and_grad(loss, argnums=(0, 1))(hid, w)

    tpu_compile(loss_and_grads, hid, w, t, kernels=3)     # forward, one backward per chunk


@pytest.mark.parametrize("gen", tpu_info.CHECKED_GENERATIONS)
@pytest.mark.parametrize("n,h,vocab", [(7, 72, 129), (4096, 4096, 32000), (16384, 8192, 128256),
                                       (8192, 1024, 256000)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_blocks_fit_vmem(gen, n, h, vocab, dtype):
    chip = tpu_info.CHIPS[gen]
    bn, bv = lce.block_sizes(n, h, vocab, dtype, chip)
    assert bn % tpu_info.sublane(dtype) == 0 and bv % 128 == 0
    assert lce.vmem_bytes(bn, bv, h, dtype) <= lce.vmem_budget(chip)
    chunk = lce.default_chunk(n, vocab, dtype)
    bn, bv = lce.bwd_block_sizes(n, h, chunk, dtype, chip)
    assert bn % tpu_info.sublane(dtype) == 0 and bv % 128 == 0
    assert lce.bwd_vmem_bytes(bn, bv, h, dtype) <= lce.vmem_budget(chip)


@pytest.mark.parametrize("gen", tpu_info.CHECKED_GENERATIONS)
def test_blocks_clear_ridge(gen):
    """bf16 at Llama-3-8B sizes: both kernels' arithmetic intensity (flops per HBM byte the
    grid moves) is above the chip's ridge point, i.e. they are compute-bound."""
    chip = tpu_info.CHIPS[gen]
    n, h, vocab, dt = 8192, 4096, 128256, jnp.bfloat16
    ridge = chip.bf16_flops / chip.hbm_bytes_per_s
    fwd = lce._fwd_cost(n, h, vocab, lce.block_sizes(n, h, vocab, dt, chip), dt)
    chunk = lce.default_chunk(n, vocab, dt)
    bwd = lce._bwd_cost(n, h, chunk, lce.bwd_block_sizes(n, h, chunk, dt, chip), dt)
    for est in (fwd, bwd):
        assert est.flops / est.bytes_accessed > ridge


def test_memory_saved_at_vocab_128k():
    """Fused keeps ~0.6 GiB of temporaries where plain linear + CE keeps >= 2 x [n, V] f32."""
    n, h, vocab = 4096, 4096, 128256
    mem = lce.peak_logits_bytes(n, h, vocab)
    assert mem["unfused"] == 2 * n * vocab * 4
    assert mem["fused"] * 5 < mem["unfused"]
    measured = lce.measured_unfused_temp_bytes(n, h, vocab)   # compile only, no run
    assert measured is None or measured >= mem["unfused"]


def test_supports():
    assert lce.supports((4, 64), (10, 64), "float32", "int64") is None
    assert "h]" in lce.supports((4, 64, 1), (10, 64), "float32", "int64")
    assert "!=" in lce.supports((4, 64), (10, 32), "float32", "int64")
    assert "dtype" in lce.supports((4, 64), (10, 64), "float16", "int64")
    assert "integer" in lce.supports((4, 64), (10, 64), "float32", "float32")
    assert lce.supports((4, 1100), (10, 1100), "float32", "int32") is None
    assert "8192" in lce.supports((4, 16384), (10, 16384), "float32", "int32")
    assert "reduction" in lce.supports((4, 64), (10, 64), "float32", "int32", reduction="x")
    assert "empty" in lce.supports((0, 64), (10, 64), "float32", "int32")
    with pytest.raises(ValueError, match="weight dtype"):
        lce.linear_cross_entropy(jnp.zeros((2, 8), jnp.float32), jnp.zeros((4, 8), jnp.bfloat16),
                                 jnp.zeros((2,), jnp.int32))


@pytest.mark.parametrize("mark", [pytest.param(0, marks=thorough)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_parity_big(dtype, mark):
    _check(130, 256, 3000, dtype, 1024, label_smoothing=0.1)
