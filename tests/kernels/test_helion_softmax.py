"""Helion softmax / log_softmax kernels: parity vs CPU torch (interpret mode), TPU lowering."""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tpu_kernels.helion_kernels import softmax as K  # noqa: E402
from helpers import tpu_compile  # noqa: E402
from helpers import torch_f32 as _t  # noqa: E402
from tpu_kernels.testing import tol  # noqa: E402



def _rand(seed, shape, dtype, scale=3.0):
    return (scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)).astype(dtype)


def _close(got, want, dtype):
    torch.testing.assert_close(_t(got), want.detach().float(), **tol(dtype, kernel=True))


def _check(shape, dtype, log, block_cols=None):
    x, dy = _rand(0, shape, dtype), _rand(1, shape, dtype, 1.0)
    fn = K.log_softmax if log else K.softmax
    y, vjp = jax.vjp(jax.jit(lambda a: fn(a, -1, block_cols)), x)
    dx, = vjp(dy)
    assert y.dtype == dtype and dx.dtype == dtype and y.shape == shape
    xt = _t(x, True)
    ref = (torch.log_softmax if log else torch.softmax)(xt, -1)
    gx, = torch.autograd.grad(ref, xt, _t(dy))
    _close(y, ref, dtype)
    _close(dx, gx, dtype)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(7, 129), (33, 384)], ids=lambda s: "x".join(map(str, s)))
def test_softmax_parity(shape, dtype, log):
    _check(shape, dtype, log)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(33, 384), (7, 200)], ids=lambda s: "x".join(map(str, s)))
def test_softmax_looped_path_parity(shape, log):
    """Column-tiled (long-row) kernels, forced with 128-column tiles; 200 is padded."""
    _check(shape, jnp.float32, log, block_cols=128)


def test_softmax_long_row_32k():
    _check((2, 32768), jnp.float32, False)


def test_softmax_nd_input_and_f64():
    x = _rand(2, (2, 3, 129), jnp.float32).astype(jnp.float64)
    y = K.softmax(x)
    assert y.dtype == jnp.float32 and y.shape == (2, 3, 129)
    _close(y, torch.softmax(_t(x), -1), jnp.float32)
    with pytest.raises(ValueError):
        K.softmax(x, dim=0)


def test_supports():
    assert K.supports((7, 129), "float32") is None
    assert K.supports((2, 3, 128000), jnp.bfloat16, dim=2) is None
    assert "last dim" in K.supports((7, 129), jnp.float32, dim=0)
    assert "float16" in K.supports((7, 129), jnp.float16)
    assert "int64" in K.supports((7, 129), jnp.int64)
    assert K.supports((0, 129), jnp.float32) is not None
    assert K.supports((), jnp.float32) is not None


@pytest.mark.parametrize("shape,block_cols", [((33, 200), 128)],
                         ids=["looped-padded"])   # rows, vocab-looped: test_real_compile.py
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_compiles_for_tpu(shape, block_cols, log):
    fn = K.log_softmax if log else K.softmax

    def f(x, dy):
        y, vjp = jax.vjp(lambda a: fn(a, -1, block_cols), x)
        return y, vjp(dy)

    args = (jax.ShapeDtypeStruct(shape, jnp.bfloat16),) * 2
    tpu_compile(f, *args, kernels=2)


@pytest.mark.thorough
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 128), (130, 1000), (64, 4096), (3, 50257)],
                         ids=lambda s: "x".join(map(str, s)))
def test_softmax_sweep(shape, dtype, log):
    _check(shape, dtype, log)
