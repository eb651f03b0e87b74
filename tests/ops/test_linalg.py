"""Parity of the matmul-family and linear-algebra lowerings (registry/xla/linalg.py)."""
from __future__ import annotations

import pytest
import torch
from helpers import check, to_tpu

aten = torch.ops.aten
NAN = float("nan")


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype) if not dtype.is_complex \
            else torch.randn(*shape, generator=g, dtype=dtype)
    return torch.randint(-9, 10, shape, generator=g).to(dtype)


# float32 at "highest" precision matches CPU within the f32 tolerance for these small k
MM_DTYPES = [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int32]


# -- matmul family ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", MM_DTYPES)
def test_mm_bmm_mv_dot(dtype):
    a, b = _rand(5, 7, dtype=dtype), _rand(7, 3, dtype=dtype, seed=1)
    check(torch.mm, a, b)
    check(torch.mm, b.t(), a.t())                              # non-contiguous
    check(torch.bmm, _rand(2, 3, 4, dtype=dtype), _rand(2, 4, 5, dtype=dtype, seed=1))
    check(torch.mv, a, _rand(7, dtype=dtype, seed=2))
    check(torch.dot, _rand(9, dtype=dtype), _rand(9, dtype=dtype, seed=1))


def test_mm_edge_cases():
    check(torch.mm, torch.zeros(3, 0), torch.zeros(0, 4))     # empty contraction -> zeros
    check(torch.mm, torch.zeros(0, 2), torch.zeros(2, 4))
    check(torch.bmm, torch.zeros(0, 2, 3), torch.zeros(0, 3, 4))
    check(torch.mm, torch.tensor([[NAN, 1.0]]), torch.ones(2, 2))
    check(torch.mm, _rand(3, 4, dtype=torch.complex64), _rand(4, 2, dtype=torch.complex64, seed=1))


def test_mm_int_wraps_like_torch():
    big = torch.full((2, 2), 2 ** 30, dtype=torch.int32)
    check(torch.mm, big, big)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_addmm_family(dtype):
    b = _rand(4, dtype=dtype, seed=3)
    m1, m2 = _rand(3, 5, dtype=dtype), _rand(5, 4, dtype=dtype, seed=1)
    check(torch.addmm, b, m1, m2)
    check(lambda s, x, y: torch.addmm(s, x, y, beta=2, alpha=3), _rand(3, 4, dtype=dtype), m1, m2)
    b1, b2 = _rand(2, 3, 5, dtype=dtype), _rand(2, 5, 4, dtype=dtype, seed=1)
    check(torch.baddbmm, _rand(2, 3, 4, dtype=dtype, seed=4), b1, b2)
    check(lambda s, x, y: torch.baddbmm(s, x, y, beta=0, alpha=2), b, b1, b2)
    # torch's CPU addbmm rounds to the result dtype after each batch's addmm; this lowering
    # rounds once, so bf16 compares on integer-valued data (exact either way)
    ib1, ib2 = (b1.round(), b2.round()) if dtype == torch.bfloat16 else (b1, b2)
    check(torch.addbmm, _rand(3, 4, dtype=dtype, seed=5).round(), ib1, ib2)
    check(lambda s, x, y: torch.addmv(s, x, y, alpha=2), _rand(3, dtype=dtype), m1, _rand(5, dtype=dtype))
    check(lambda s, x, y: torch.addr(s, x, y, beta=3), _rand(3, 4, dtype=dtype), _rand(3, dtype=dtype),
          _rand(4, dtype=dtype, seed=1))


def test_addmm_beta_zero_ignores_nan():
    s = torch.full((2, 2), NAN)
    check(lambda s, x, y: torch.addmm(s, x, y, beta=0), s, _rand(2, 3), _rand(3, 2))
    check(lambda s, x, y: torch.addr(s, x, y, beta=False), torch.tensor([[True, False]]),
          torch.tensor([True]), torch.tensor([False, True]))


def test_vdot_trilinear():
    check(torch.vdot, _rand(5), _rand(5, seed=1))
    check(torch.vdot, _rand(5, dtype=torch.complex64), _rand(5, dtype=torch.complex64, seed=1))
    i1, i2, i3 = _rand(2, 3), _rand(2, 4, seed=1), _rand(2, 5, seed=2)
    check(lambda a, b, c: aten._trilinear(a, b, c, [2, 3], [1, 3], [1, 2], []), i1, i2, i3)
    check(lambda a, b, c: aten._trilinear(a, b, c, [], [], [], [1]), i1, _rand(2, 3, seed=1), _rand(2, 3, seed=2))
    w = _rand(6, 3, 4)
    check(lambda x1, x2, w: torch.nn.functional.bilinear(x1, x2, w), i1, _rand(2, 4, seed=3), w)


def test_matmul_grads():
    a, b = _rand(3, 5).requires_grad_(), _rand(5, 4, seed=1).requires_grad_()
    check(torch.mm, a, b, grad=True)
    check(torch.addmm, _rand(4, seed=2).requires_grad_(), a, b, grad=True)
    x, y = _rand(2, 3, 5).requires_grad_(), _rand(2, 5, 4, seed=1).requires_grad_()
    check(torch.bmm, x, y, grad=True)
    check(torch.baddbmm, _rand(2, 3, 4, seed=3).requires_grad_(), x, y, grad=True)
    check(torch.matmul, _rand(4, 3, 5).requires_grad_(), b, grad=True)


def test_float32_matmul_precision_is_keyed():
    """Each precision setting lowers with its jax precision (the dispatch cache keys on it)."""
    import jax
    import jax.numpy as jnp
    from tpu_kernels.registry.xla import linalg
    a, b = _rand(8, 16), _rand(16, 8, seed=1)
    old = torch.get_float32_matmul_precision()
    want = {"highest": jax.lax.Precision.HIGHEST, "high": jax.lax.Precision.HIGH,
            "medium": jax.lax.Precision.DEFAULT}
    try:
        for p, prec in want.items():
            torch.set_float32_matmul_precision(p)
            assert linalg._precision(jnp.dtype(jnp.float32)) == prec
            assert linalg._precision(jnp.dtype(jnp.float64)) == jax.lax.Precision.HIGHEST
            if p == "highest":
                check(torch.mm, a, b)
            else:  # runs (a fresh trace per setting); on TPU these use bf16 passes
                torch.mm(*to_tpu((a, b))).cpu()
    finally:
        torch.set_float32_matmul_precision(old)
