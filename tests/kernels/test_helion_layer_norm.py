"""Helion LayerNorm kernels: parity vs CPU torch (interpret mode) and TPU lowering."""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tpu_kernels.helion_kernels import layer_norm as K  # noqa: E402
from helpers import tpu_compile  # noqa: E402
from helpers import torch_f32 as _t  # noqa: E402
from tpu_kernels.testing import tol  # noqa: E402

EPS = 1e-5


def _rand(seed, shape, dtype, shift=0.0):
    return (jax.random.normal(jax.random.key(seed), shape, jnp.float32) + shift).astype(dtype)


def _close(got, want, dtype):
    torch.testing.assert_close(_t(got), want.detach().float(), **tol(dtype, kernel=True))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(7, 129), (33, 384)], ids=lambda s: "x".join(map(str, s)))
def test_layer_norm_fwd_bwd_parity(shape, dtype):
    n = shape[-1:]
    x, w, b, dy = _rand(0, shape, dtype, 2.0), _rand(1, n, dtype), _rand(2, n, dtype), _rand(3, shape, dtype)
    out, vjp = jax.vjp(jax.jit(lambda a, c, d: K.layer_norm(a, c, d, EPS)), x, w, b)
    dx, dw, db = vjp(dy)
    assert out.dtype == dx.dtype == dw.dtype == db.dtype == dtype
    xt, wt, bt = _t(x, True), _t(w, True), _t(b, True)
    ref = torch.nn.functional.layer_norm(xt, n, wt, bt, EPS)
    gx, gw, gb = torch.autograd.grad(ref, (xt, wt, bt), _t(dy))
    _close(out, ref, dtype)
    _close(dx, gx, dtype)
    _close(dw, gw, dtype)
    _close(db, gb, dtype)


def test_native_layer_norm_entry_points():
    x, w, b = _rand(4, (2, 3, 128), jnp.float32, 1.0), _rand(5, (128,), jnp.float32), _rand(6, (128,), jnp.float32)
    out, mean, rstd = K.layer_norm_fwd(x, w, b, EPS)
    r_out, r_mean, r_rstd = torch.ops.aten.native_layer_norm(_t(x), [128], _t(w), _t(b), EPS)
    assert mean.shape == tuple(r_mean.shape) == rstd.shape
    for got, want in ((out, r_out), (mean, r_mean), (rstd, r_rstd)):
        _close(got, want, jnp.float32)
    dy = _rand(7, (2, 3, 128), jnp.float32)
    dx, dw, db = K.layer_norm_bwd(dy, x, mean, rstd, w, b)
    r_dx, r_dw, r_db = torch.ops.aten.native_layer_norm_backward(
        _t(dy), _t(x), [128], r_mean, r_rstd, _t(w), _t(b), [True, True, True])
    for got, want in ((dx, r_dx), (dw, r_dw), (db, r_db)):
        _close(got, want, jnp.float32)
    # no affine params
    out, mean, rstd = K.layer_norm_fwd(x, None, None, EPS)
    dx, dw, db = K.layer_norm_bwd(dy, x, mean, rstd)
    assert dw is None and db is None
    xt = _t(x, True)
    gx, = torch.autograd.grad(torch.nn.functional.layer_norm(xt, [128], None, None, EPS), xt, _t(dy))
    _close(dx, gx, jnp.float32)


def test_supports():
    assert K.supports((7, 129), "float32", (129,), "float32", "float32") is None
    assert K.supports((7, 129), jnp.float64) is None
    assert "float16" in K.supports((7, 129), jnp.float16)
    assert "int32" in K.supports((7, 129), jnp.int32)
    assert "hidden" in K.supports((2, 1 << 17), jnp.bfloat16)
    assert "weight" in K.supports((7, 129), jnp.float32, (128,), jnp.float32)


@pytest.mark.parametrize("shape,dtype", [((7, 129), jnp.float32)],
                         ids=["7x129-f32"])   # bf16 at production shapes: test_real_compile.py
def test_layer_norm_compiles_for_tpu(shape, dtype):
    def f(x, w, b, dy):
        out, vjp = jax.vjp(lambda a, c, d: K.layer_norm(a, c, d, EPS), x, w, b)
        return out, vjp(dy)

    s, n = jax.ShapeDtypeStruct(shape, dtype), jax.ShapeDtypeStruct(shape[-1:], dtype)
    tpu_compile(f, s, n, n, s, kernels=3)


@pytest.mark.thorough
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 128), (130, 1000), (512, 2048), (17, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
def test_layer_norm_sweep(shape, dtype):
    test_layer_norm_fwd_bwd_parity(shape, dtype)


def test_layer_norm_dwdb_several_row_groups():
    """The weight/bias grads' two-stage reduction over more than one row tile (ragged rows)."""
    test_layer_norm_fwd_bwd_parity((768, 256), jnp.float32)   # 3 row tiles of 256 (f32)


def test_layer_norm_bwd_compiles_at_128k_rows_v7x():
    """The backward's VMEM no longer grows with the row count (it held the whole mean/rstd
    columns before and overflowed v7x's 64 MiB at ~32k rows)."""
    rows, n = 131072, 4096
    S = jax.ShapeDtypeStruct
    col, vec = S((rows, 1), jnp.float32), S((n,), jnp.bfloat16)
    summary = tpu_compile(lambda dy, x, mu, r, w, b: K.layer_norm_bwd(dy, x, mu, r, w, b),
                          S((rows, n), jnp.bfloat16), S((rows, n), jnp.bfloat16), col, col,
                          vec, vec, chip="v7x", kernels=2)
    assert summary.max_kernel_vmem < 32 * 2**20, summary.format()
