"""Helion SwiGLU / GEGLU / GLU kernels: parity vs CPU torch (interpret mode), TPU lowering."""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tpu_kernels.helion_kernels import glu as K  # noqa: E402
from helpers import tpu_compile  # noqa: E402
from helpers import torch_f32 as _t  # noqa: E402
from tpu_kernels.testing import tol  # noqa: E402



def _rand(seed, shape, dtype):
    return (2 * jax.random.normal(jax.random.key(seed), shape, jnp.float32)).astype(dtype)


def _close(got, want, dtype, atol_scale=1.0):
    t = tol(dtype, kernel=True)
    t["atol"] *= atol_scale
    torch.testing.assert_close(_t(got), want.detach().float(), **t)


_REF = {
    "swiglu": lambda a, b: F.silu(a) * b,
    "geglu": lambda a, b: F.gelu(a) * b,
    "geglu_tanh": lambda a, b: F.gelu(a, approximate="tanh") * b,
}
_OURS = {
    "swiglu": K.swiglu,
    "geglu": K.geglu,
    "geglu_tanh": lambda a, b: K.geglu(a, b, "tanh"),
}


@pytest.mark.parametrize("op", list(_REF))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(7, 129), (2, 33, 384)], ids=lambda s: "x".join(map(str, s)))
def test_gated_parity(shape, dtype, op):
    a, b, dy = _rand(0, shape, dtype), _rand(1, shape, dtype), _rand(2, shape, dtype)
    out, vjp = jax.vjp(jax.jit(_OURS[op]), a, b)
    da, db = vjp(dy)
    assert out.dtype == da.dtype == db.dtype == dtype
    at, bt = _t(a, True), _t(b, True)
    ref = _REF[op](at, bt)
    ga, gb = torch.autograd.grad(ref, (at, bt), _t(dy))
    # tanh-GELU: torch and XLA tanh differ by a few ulp on |values| ~ 10
    scale = 10.0 if op == "geglu_tanh" else 1.0
    _close(out, ref, dtype, scale)
    _close(da, ga, dtype, scale)
    _close(db, gb, dtype, scale)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_glu_parity(dtype):
    x, dy = _rand(3, (7, 258), dtype), _rand(4, (7, 129), dtype)
    out, vjp = jax.vjp(jax.jit(K.glu), x)
    dx, = vjp(dy)
    xt = _t(x, True)
    ref = F.glu(xt, -1)
    gx, = torch.autograd.grad(ref, xt, _t(dy))
    _close(out, ref, dtype)
    _close(dx, gx, dtype)


def test_f64_inputs_downcast():
    a = _rand(5, (7, 129), jnp.float32).astype(jnp.float64)
    out = K.swiglu(a, a)
    assert out.dtype == jnp.float32
    _close(out, F.silu(_t(a)) * _t(a), jnp.float32)


def test_supports():
    assert K.supports((7, 129), "float32") is None
    assert K.supports((7, 129), jnp.bfloat16, approximate="tanh") is None
    assert "float16" in K.supports((7, 129), jnp.float16)
    assert "approximation" in K.supports((7, 129), jnp.float32, approximate="erf")
    assert "odd" in K.supports((7, 129), jnp.float32, glu_halves=True)
    assert "last dim" in K.supports((8, 128), jnp.float32, dim=0, glu_halves=True)
    assert K.supports((8, 128), jnp.float32, dim=1, glu_halves=True) is None


@pytest.mark.parametrize("op", ["geglu"])   # swiglu, geglu_tanh, glu: test_real_compile
def test_compiles_for_tpu(op):
    shape = (256, 1024)
    if op == "glu":
        def f(x, dy):
            out, vjp = jax.vjp(K.glu, x)
            return out, vjp(dy)
        args = (jax.ShapeDtypeStruct((256, 2048), jnp.bfloat16), jax.ShapeDtypeStruct(shape, jnp.bfloat16))
    else:
        def f(a, b, dy):
            out, vjp = jax.vjp(_OURS[op], a, b)
            return out, vjp(dy)
        args = (jax.ShapeDtypeStruct(shape, jnp.bfloat16),) * 3
    tpu_compile(f, *args, kernels=2)


def test_unaligned_compiles_for_tpu():
    s = jax.ShapeDtypeStruct((7, 129), jnp.float32)
    tpu_compile(K.swiglu, s, s, kernels=1)


@pytest.mark.thorough
@pytest.mark.parametrize("op", list(_REF))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 128), (130, 1000), (64, 4096), (4, 3, 11008)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gated_sweep(shape, dtype, op):
    test_gated_parity(shape, dtype, op)
