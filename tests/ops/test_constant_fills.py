"""Small constant fills reuse one kept array (runtime_ops/constant_fills.py): same values and
dtypes as CPU torch, and every result still a memory of its own."""
from __future__ import annotations

import pytest
import torch

import tpu_kernels
from tpu_kernels.runtime_ops import constant_fills


def _array(t):
    return t._tpu_storage.array


def test_a_repeated_fill_shares_the_kept_array_and_each_result_is_its_own_memory():
    a = torch.ones(3, 4, device="tpu")
    b = torch.ones(3, 4, device="tpu")
    assert _array(a) is _array(b)                       # no launch: the kept array
    assert a._tpu_storage is not b._tpu_storage
    b.add_(1)
    a[0, 0] = 7
    assert b.tolist() == [[2.0] * 4] * 3
    assert a.sum().item() == 7 + 11
    assert torch.ones(3, 4, device="tpu").tolist() == [[1.0] * 4] * 3


@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(5, device=d), lambda d: torch.ones(2, 3, dtype=torch.int32, device=d),
    lambda d: torch.full((4,), -0.0, device=d), lambda d: torch.full((4,), 0.0, device=d),
    lambda d: torch.full((2,), 1, device=d), lambda d: torch.full((2,), True, device=d),
    lambda d: torch.full((2,), 1.0, device=d), lambda d: torch.full((3,), float("nan"), device=d),
    lambda d: torch.full((3,), float("-inf"), dtype=torch.bfloat16, device=d),
    lambda d: torch.scalar_tensor(2.5, device=d),
    lambda d: torch.ones_like(torch.zeros(2, 3, device=d).t()),
    lambda d: torch.zeros(2, 3, dtype=torch.float16, device=d).new_full((4,), 3),
    lambda d: torch.zeros(2, device=d).new_ones((2, 2), dtype=torch.int64),
    lambda d: torch.full_like(torch.zeros(3, device=d), 2, dtype=torch.uint8),
], ids=["zeros", "ones int32", "full -0.0", "full 0.0", "full int", "full bool", "full float",
        "full nan", "full -inf bf16", "scalar_tensor", "ones_like transposed", "new_full f16",
        "new_ones int64", "full_like uint8"])
def test_fills_match_cpu_twice(make):
    want = make("cpu")
    for _ in range(2):                                   # the first made, the second kept
        got = make("tpu")
        assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
        torch.testing.assert_close(got.cpu(), want, equal_nan=True)
        if want.is_floating_point():                      # (-0.0 is not 0.0)
            assert torch.equal(got.cpu().signbit(), want.signbit())


def test_the_default_dtype_is_part_of_a_fill():
    a = torch.zeros(2, device="tpu")
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert torch.zeros(2, device="tpu").dtype == torch.float64
        assert torch.full((2,), 1.5, device="tpu").dtype == torch.float64
    finally:
        torch.set_default_dtype(old)
    assert a.dtype == torch.zeros(2, device="tpu").dtype == torch.float32


def test_big_fills_are_not_kept():
    n = constant_fills.MAX_BYTES // 4 + 1
    a, b = torch.zeros(n, device="tpu"), torch.zeros(n, device="tpu")
    assert _array(a) is not _array(b)


def test_a_compiled_program_writing_a_fill_never_gives_up_the_kept_array():
    f = torch.compile(lambda x: x.add_(1), backend="tpu")
    for k in range(3):
        x = torch.zeros(4, 4, device="tpu")
        f(x)
        assert x.tolist() == [[1.0] * 4] * 4, k
    assert torch.zeros(4, 4, device="tpu").tolist() == [[0.0] * 4] * 4


def test_fills_in_deferred_mode_and_the_backward_seed():
    with tpu_kernels.deferred():
        a = torch.ones(3, device="tpu") * 2
        b = torch.ones(3, device="tpu")
    assert a.tolist() == [2.0] * 3 and b.tolist() == [1.0] * 3
    w = torch.ones(3, device="tpu", requires_grad=True)
    for _ in range(2):                                  # backward starts from a kept ones_like
        w.grad = None
        (w * 3).sum().backward()
        assert w.grad.tolist() == [3.0] * 3


def test_a_kept_array_donated_by_user_jax_code_is_made_again():
    import jax
    a = torch.ones(5, device="tpu")
    jax.jit(lambda x: x * 2, donate_argnums=0)(a.jax())     # (interop: gives the array up)
    b = torch.ones(5, device="tpu")
    assert b.tolist() == [1.0] * 5
