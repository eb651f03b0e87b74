"""Helion RMSNorm kernels: parity vs CPU torch (interpret mode) and TPU lowering."""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tpu_kernels.helion_kernels import rms_norm as K  # noqa: E402
from helpers import tpu_compile  # noqa: E402
from helpers import torch_f32 as _t  # noqa: E402
from tpu_kernels.testing import tol  # noqa: E402

EPS = 1e-6


def _rand(seed, shape, dtype):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype)


def _close(got, want, dtype):
    torch.testing.assert_close(_t(got), want.detach().float(), **tol(dtype, kernel=True))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(7, 129), (33, 384)], ids=lambda s: "x".join(map(str, s)))
def test_rms_norm_fwd_bwd_parity(shape, dtype):
    x, w, dy = _rand(0, shape, dtype), _rand(1, shape[-1:], dtype), _rand(2, shape, dtype)
    out, vjp = jax.vjp(jax.jit(lambda a, b: K.rms_norm(a, b, EPS)), x, w)
    dx, dw = vjp(dy)
    assert out.dtype == dtype and dx.dtype == dtype and dw.dtype == dtype
    xt, wt = _t(x, True), _t(w, True)
    ref = torch.nn.functional.rms_norm(xt, shape[-1:], wt, EPS)
    gx, gw = torch.autograd.grad(ref, (xt, wt), _t(dy))
    _close(out, ref, dtype)
    _close(dx, gx, dtype)
    _close(dw, gw, dtype)


def test_rms_norm_fwd_rstd_matches_fused_op():
    x, w = _rand(3, (2, 3, 128), jnp.float32), _rand(4, (128,), jnp.float32)
    out, rstd = K.rms_norm_fwd(x, w, EPS)
    ref_out, ref_rstd = torch.ops.aten._fused_rms_norm(_t(x), [128], _t(w), EPS)
    assert rstd.shape == tuple(ref_rstd.shape) and rstd.dtype == jnp.float32
    _close(out, ref_out, jnp.float32)
    _close(rstd, ref_rstd, jnp.float32)
    # backward entry point (as aten._fused_rms_norm_backward), no weight
    dy = _rand(5, (2, 3, 128), jnp.float32)
    dx, dw = K.rms_norm_bwd(dy, x, None, rstd)
    assert dw is None
    xt = _t(x, True)
    gx, = torch.autograd.grad(torch.nn.functional.rms_norm(xt, [128], None, EPS), xt, _t(dy))
    _close(dx, gx, jnp.float32)


def test_rms_norm_default_eps_and_f64_input():
    x = _rand(6, (7, 129), jnp.float32).astype(jnp.float64)
    out = K.rms_norm(x, None)   # eps=None -> float64's eps, as torch (computed in float32)
    assert out.dtype == jnp.float32
    ref = torch.nn.functional.rms_norm(_t(x), [129], None, None)
    _close(out, ref, jnp.float32)


def test_rms_norm_default_eps_is_the_compute_types_for_bfloat16():
    # torch's eps=None is float32's epsilon for a bfloat16 input (its compute type);
    # bfloat16's own (0.0078) swamped the mean square of small activations (~9x too small)
    x = (_rand(7, (4, 128), jnp.float32) * 0.01).astype(jnp.bfloat16)
    out, rstd = K.rms_norm_fwd(x, None)
    ref_out, ref_rstd = torch.ops.aten._fused_rms_norm(_t(x).to(torch.bfloat16), [128], None, None)
    _close(out, ref_out, jnp.bfloat16)
    _close(rstd, ref_rstd, jnp.float32)
    _close(K.rms_norm(x, None), torch.nn.functional.rms_norm(_t(x).to(torch.bfloat16), [128]), jnp.bfloat16)


def test_supports():
    assert K.supports((7, 129), "float32", (129,), "float32") is None
    assert K.supports((4, 128), jnp.bfloat16) is None
    assert K.supports((4, 128), jnp.float64) is None          # downcast by the wrapper
    assert "float16" in K.supports((4, 128), jnp.float16)
    assert "int32" in K.supports((4, 128), jnp.int32)
    assert "hidden" in K.supports((4, 1 << 17), jnp.float32)
    assert "weight" in K.supports((4, 128), jnp.float32, (64,), jnp.float32)
    assert "zero-size" in K.supports((0, 128), jnp.float32)


@pytest.mark.parametrize("shape,dtype", [((7, 129), jnp.float32)],
                         ids=["7x129-f32"])   # bf16 at production shapes: test_real_compile.py
def test_rms_norm_compiles_for_tpu(shape, dtype):
    def f(x, w, dy):
        out, vjp = jax.vjp(lambda a, b: K.rms_norm(a, b, EPS), x, w)
        return out, vjp(dy)

    args = (jax.ShapeDtypeStruct(shape, dtype), jax.ShapeDtypeStruct(shape[-1:], dtype),
            jax.ShapeDtypeStruct(shape, dtype))
    tpu_compile(f, *args, kernels=3)   # fwd, dx, dw


@pytest.mark.thorough
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 128), (130, 1000), (512, 2048), (17, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
def test_rms_norm_sweep(shape, dtype):
    test_rms_norm_fwd_bwd_parity(shape, dtype)


def test_rms_norm_dw_several_row_groups():
    """The weight grad's two-stage reduction over more than one row tile (ragged rows)."""
    test_rms_norm_fwd_bwd_parity((768, 256), jnp.float32)   # 3 row tiles of 256 (f32)


def test_rms_norm_bwd_compiles_at_128k_rows_v7x():
    """The backward's VMEM no longer grows with the row count (it held the whole rstd
    column before and overflowed v7x's 64 MiB at ~64k rows)."""
    rows, n = 131072, 4096
    S = jax.ShapeDtypeStruct
    summary = tpu_compile(lambda dy, x, w, r: K.rms_norm_bwd(dy, x, w, r),
                          S((rows, n), jnp.bfloat16), S((rows, n), jnp.bfloat16),
                          S((n,), jnp.bfloat16), S((rows, 1), jnp.float32), chip="v7x", kernels=2)
    assert summary.max_kernel_vmem < 32 * 2**20, summary.format()
