"""Helion RoPE kernel (half and interleaved layouts): parity vs a torch reference, TPU lowering."""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tpu_kernels.helion_kernels import rope as K  # noqa: E402
from helpers import tpu_compile  # noqa: E402
from helpers import torch_f32 as _t  # noqa: E402
from tpu_kernels.testing import tol  # noqa: E402



def _close(got, want, dtype):
    torch.testing.assert_close(_t(got), want.detach().float(), **tol(dtype, kernel=True))


def _tables(s, d, interleaved):
    inv = 1.0 / (10000 ** (np.arange(0, d, 2) / d))
    ang = np.arange(s)[:, None] * inv[None, :]                  # [s, d/2]
    ang = np.repeat(ang, 2, axis=1) if interleaved else np.concatenate([ang, ang], 1)
    return jnp.asarray(np.cos(ang), jnp.float32), jnp.asarray(np.sin(ang), jnp.float32)


def _ref(x, cos, sin, interleaved):
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        rot = torch.stack([-x1, x0], dim=-1).flatten(-2)
    else:
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 3, 7, 64), (2, 3, 33, 128)], ids=lambda s: "x".join(map(str, s)))
def test_rope_parity(shape, dtype, interleaved):
    cos, sin = _tables(shape[2], shape[3], interleaved)
    x = jax.random.normal(jax.random.key(0), shape, jnp.float32).astype(dtype)
    dy = jax.random.normal(jax.random.key(1), shape, jnp.float32).astype(dtype)
    out, vjp = jax.vjp(jax.jit(lambda a: K.rope(a, cos, sin, interleaved)), x)
    dx, = vjp(dy)
    assert out.dtype == dx.dtype == dtype and out.shape == shape
    xt = _t(x, True)
    ref = _ref(xt, _t(cos), _t(sin), interleaved)
    gx, = torch.autograd.grad(ref, xt, _t(dy))
    _close(out, ref, dtype)
    _close(dx, gx, dtype)


def test_rope_qk_long_seq_padded():
    shape = (1, 2, 300, 64)      # > SEQ_TILE: padded to whole sequence tiles
    cos, sin = _tables(300, 64, False)
    q = jax.random.normal(jax.random.key(2), shape, jnp.float32)
    k = jax.random.normal(jax.random.key(3), shape, jnp.float32)
    qo, ko = K.rope_qk(q, k, cos, sin)
    _close(qo, _ref(_t(q), _t(cos), _t(sin), False), jnp.float32)
    _close(ko, _ref(_t(k), _t(cos), _t(sin), False), jnp.float32)


def test_supports():
    assert K.supports((2, 4, 16, 128), "bfloat16", (16, 128)) is None
    assert K.supports((2, 4, 16, 128), jnp.float32, (1, 1, 16, 128), jnp.float32) is None
    assert "rank" in K.supports((4, 16, 128), jnp.float32, (16, 128))
    assert "odd" in K.supports((2, 4, 16, 127), jnp.float32, (16, 127))
    assert "cos/sin" in K.supports((2, 4, 16, 128), jnp.float32, (8, 128))
    assert "float16" in K.supports((2, 4, 16, 128), jnp.float16, (16, 128))


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("shape", [(1, 3, 7, 64)],   # production shapes: test_real_compile.py
                         ids=lambda s: "x".join(map(str, s)))
def test_rope_compiles_for_tpu(shape, interleaved):
    def f(x, cos, sin, dy):
        out, vjp = jax.vjp(lambda a: K.rope(a, cos, sin, interleaved), x)
        return out, vjp(dy)

    xs = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    cs = jax.ShapeDtypeStruct(shape[2:], jnp.float32)
    tpu_compile(f, xs, cs, cs, xs, kernels=2)


@pytest.mark.thorough
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(2, 8, 512, 128), (1, 5, 1000, 96)], ids=lambda s: "x".join(map(str, s)))
def test_rope_sweep(shape, dtype, interleaved):
    test_rope_parity(shape, dtype, interleaved)
