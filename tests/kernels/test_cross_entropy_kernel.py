"""Pallas cross entropy (interpret mode) vs the jnp reference and CPU torch, plus TPU export."""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tpu_kernels.pallas import cross_entropy as ce
from tpu_kernels.pallas import tpu_info, tuned
from helpers import tpu_compile
from tpu_kernels.pallas.reference import cross_entropy as ref
from tpu_kernels.testing import tol

jax.config.update("jax_enable_x64", True)

THOROUGH = os.environ.get("TPU_KERNELS_HYPOTHESIS_PROFILE") == "thorough"
thorough = [pytest.mark.thorough, pytest.mark.skipif(not THOROUGH, reason="thorough sweep")]


def _inputs(n, n_cls, dtype, weighted, seed=0, ignore_index=-100):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((n, n_cls)) * 3, jnp.float32).astype(dtype)
    t = rng.integers(0, n_cls, n)
    t[:: 3] = ignore_index                                   # some ignored rows
    w = jnp.asarray(rng.random(n_cls) + 0.5, jnp.float32) if weighted else None
    return x, t, w


def _torch(x, t, w, **kw):
    """Loss and logits grad from torch in f32 on the same (rounded) values."""
    xt = torch.tensor(np.asarray(x.astype(jnp.float32)), requires_grad=True)
    wt = None if w is None else torch.tensor(np.asarray(w))
    loss = torch.nn.functional.cross_entropy(xt, torch.tensor(t), wt, **kw)
    cot = torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape)
    loss.backward(cot)
    return loss.detach().numpy(), xt.grad.numpy(), cot.numpy()


def _check(n, n_cls, dtype, weighted, **kw):
    x, t, w = _inputs(n, n_cls, dtype, weighted, ignore_index=kw.get("ignore_index", -100))
    want, want_dx, cot = _torch(x, t, w, **kw)
    tj = jnp.asarray(t)
    loss, vjp = jax.vjp(lambda x: ce.cross_entropy(x, tj, w, **kw), x)
    (dx,) = vjp(jnp.asarray(cot, loss.dtype))
    assert loss.dtype == x.dtype and dx.dtype == x.dtype
    t = tol(dtype, kernel=True)
    np.testing.assert_allclose(np.asarray(loss, np.float32), want, **t)
    np.testing.assert_allclose(np.asarray(dx, np.float32), want_dx, **t)
    r = ref.cross_entropy(x, tj, w, **kw)
    np.testing.assert_allclose(np.asarray(loss, np.float32), np.asarray(r, np.float32), **t)


@pytest.mark.parametrize("n,n_cls,dtype,weighted,kw", [
    (7, 129, jnp.float32, False, dict(reduction="mean")),
    (33, 300, jnp.float32, True, dict(reduction="mean", label_smoothing=0.1)),
    (16, 1024, jnp.float32, True, dict(reduction="sum", label_smoothing=0.2)),
    (9, 300, jnp.float32, True, dict(reduction="none", ignore_index=5)),
    (33, 300, jnp.bfloat16, True, dict(reduction="mean", label_smoothing=0.1)),
    (16, 1024, jnp.bfloat16, False, dict(reduction="none")),
])
def test_parity(n, n_cls, dtype, weighted, kw):
    _check(n, n_cls, dtype, weighted, **kw)


def test_many_vocab_blocks_with_tail(monkeypatch):
    """Force 128-wide vocab blocks so the online max/sum runs over several blocks + a tail."""
    monkeypatch.setattr(ce, "block_sizes", lambda n, c, dt, chip=None: (8, 128))
    _check(20, 300, jnp.float32, True, reduction="mean", label_smoothing=0.3)


def test_int64_targets_and_no_ignored():
    x, t, _ = _inputs(8, 256, jnp.float32, False)
    t = np.abs(t) % 256
    got = ce.cross_entropy(x, jnp.asarray(t, jnp.int64))
    want, _, _ = _torch(x, t, None)
    np.testing.assert_allclose(np.asarray(got), want, **tol(jnp.float32, kernel=True))


@pytest.mark.parametrize("dtype", [jnp.float32])   # bf16: test_real_compile
def test_compiles_for_tpu(dtype):
    x = jax.ShapeDtypeStruct((33, 300), dtype)
    t = jax.ShapeDtypeStruct((33,), jnp.int32)
    w = jax.ShapeDtypeStruct((300,), jnp.float32)
    fn = functools.partial(ce.cross_entropy, label_smoothing=0.1)

    def loss_and_grad(x, t, w):
        return jax.value_and_grad(lambda x: fn(x, t, w).astype(jnp.float32))(x)

    tpu_compile(loss_and_grad, x, t, w, kernels=2)


@pytest.mark.parametrize("gen", tpu_info.CHECKED_GENERATIONS)
@pytest.mark.parametrize("n,n_cls", [(8, 129), (4096, 32000), (16384, 128256), (8192, 256000)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_blocks_fit_vmem(gen, n, n_cls, dtype):
    chip = tpu_info.CHIPS[gen]
    bn, bv = ce.block_sizes(n, n_cls, dtype, chip)
    assert bn % tpu_info.sublane(dtype) == 0 and bv % 128 == 0
    hit = tuned.lookup_blocks("cross_entropy", chip, dtype, n=n, v=n_cls)     # tuned: checked by compiling
    assert ce.vmem_bytes(bn, bv, dtype) <= tuned.vmem_budget(chip, hit)


def test_supports():
    assert ce.supports((4, 10), "float32", "int64") is None
    assert ce.supports((4, 10), jnp.bfloat16, jnp.int32, (10,), reduction="sum") is None
    assert "2-D" in ce.supports((2, 4, 10), "float32", "int64")
    assert "dtype" in ce.supports((4, 10), "float16", "int64")
    assert "integer" in ce.supports((4, 10), "float32", "float32")
    assert "weight" in ce.supports((4, 10), "float32", "int32", (9,))
    assert "reduction" in ce.supports((4, 10), "float32", "int32", reduction="avg")
    assert "label_smoothing" in ce.supports((4, 10), "float32", "int32", label_smoothing=1.5)
    assert "empty" in ce.supports((0, 10), "float32", "int32")
    with pytest.raises(ValueError, match="reduction"):
        ce.cross_entropy(jnp.zeros((2, 4), jnp.float32), jnp.zeros((2,), jnp.int32), reduction="avg")


@pytest.mark.parametrize("n,n_cls", [(130, 5000), (64, 32000)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("mark", [pytest.param(0, marks=thorough)])
def test_parity_big(n, n_cls, dtype, eps, mark):
    _check(n, n_cls, dtype, True, reduction="mean", label_smoothing=eps)
