"""Parity of the reduction and scan lowerings (registry/xla/reductions.py, moments.py,
norms.py, order_stats.py, scans.py) with CPU torch."""
from __future__ import annotations

import re

import pytest
import torch
from helpers import check

aten = torch.ops.aten
NAN = float("nan")


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


def _noncontig(*shape, dtype=torch.float32):
    """A transposed (non-contiguous) tensor of ``shape``."""
    return _rand(*reversed(shape), dtype=dtype).transpose(0, -1)


FLOATS = [torch.float32, torch.bfloat16]
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.int32]


# -- sum / mean / prod ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + [torch.bool])
def test_sum(dtype):
    x = _rand(3, 5, 7, dtype=dtype)
    check(lambda a: a.sum(), x)
    check(lambda a: a.sum(1), x)
    check(lambda a: a.sum((0, 2), keepdim=True), x)
    check(lambda a: a.sum(-1, dtype=torch.float64), x)
    check(lambda a: aten.sum.dim_IntList(a, []), x)
    check(lambda a: a.sum(0), _noncontig(4, 3, dtype=dtype))


def test_sum_edge_cases():
    check(lambda a: a.sum(), torch.tensor(2.5))
    check(lambda a: a.sum(0), torch.tensor(2.5))
    check(lambda a: a.sum(1), torch.zeros(3, 0))
    check(lambda a: a.sum(), torch.zeros(0))
    check(lambda a: a.sum(1), torch.tensor([[1.0, NAN], [2.0, 3.0]]))


@pytest.mark.parametrize("dtype", FLOATS + [torch.float64])
def test_mean(dtype):
    x = _rand(4, 6, 5, dtype=dtype)
    check(lambda a: a.mean(), x)
    check(lambda a: a.mean(1), x)
    check(lambda a: a.mean((0, -1), keepdim=True), x)
    check(lambda a: a.mean(0), _noncontig(5, 3, dtype=dtype))
    check(lambda a: a.mean(1), torch.zeros(2, 0, dtype=dtype))


def test_mean_dtype_arg():
    check(lambda a: a.mean(1, dtype=torch.float64), _rand(3, 4))
    check(lambda a: a.mean(dtype=torch.float32), _rand(3, 4, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32])
def test_prod_nansum(dtype):
    x = _rand(3, 4, dtype=dtype)
    check(lambda a: a.prod(), x)
    check(lambda a: a.prod(1), x)
    check(lambda a: a.prod(0, keepdim=True), x)
    check(lambda a: a.nansum(), x)
    check(lambda a: a.nansum(1), x)
    check(lambda a: a.nansum(), torch.tensor([[1.0, NAN], [2.0, 3.0]]))


def test_trace():
    check(torch.trace, _rand(4, 5))
    check(torch.trace, _rand(3, 3, dtype=torch.int32))


def test_sum_mean_grad():
    x = _rand(3, 4).requires_grad_()
    check(lambda a: a.sum(1), x, grad=True)
    check(lambda a: a.mean((0, 1)), x, grad=True)


# -- max / min family -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_amax_amin_max_min(dtype):
    x = _rand(4, 5, 3, dtype=dtype)
    check(lambda a: a.amax(1), x)
    check(lambda a: a.amin((0, 2), keepdim=True), x)
    check(lambda a: a.amax(), x)
    check(lambda a: a.max(), x)
    check(lambda a: a.min(), x)
    check(lambda a: a.max(1), x)
    check(lambda a: a.min(-1, keepdim=True), x)
    check(lambda a: a.argmax(), x)
    check(lambda a: a.argmin(1), x)
    check(lambda a: a.argmax(0, keepdim=True), x)
    check(lambda a: torch.aminmax(a), x)
    check(lambda a: torch.aminmax(a, dim=1, keepdim=True), x)
    check(lambda a: a.max(0), _noncontig(3, 5, dtype=dtype))


def test_max_ties_and_nan():
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    check(lambda a: a.max(1), ties)
    check(lambda a: a.min(1), ties)
    check(lambda a: a.argmax(1), ties)
    nan = torch.tensor([[1.0, NAN, 3.0, NAN], [2.0, 5.0, -1.0, 0.0]])
    check(lambda a: a.max(1), nan)
    check(lambda a: a.min(1), nan)
    check(lambda a: a.argmax(1), nan)
    check(lambda a: a.argmin(1), nan)
    check(lambda a: a.amax(1), nan)
    check(lambda a: a.amin(), nan)
    check(lambda a: a.max(), nan)


def test_max_0d():
    check(lambda a: a.max(0), torch.tensor(3.0))
    check(lambda a: a.argmax(), torch.tensor(3.0))
    check(lambda a: a.amax(), torch.tensor(3.0))


def test_max_grad():
    x = _rand(3, 5).requires_grad_()
    check(lambda a: a.amax(1), x, grad=True)
    check(lambda a: a.max(1)[0], x, grad=True)


# -- var / std -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS + [torch.float64])
def test_var_std(dtype):
    x = _rand(4, 7, 3, dtype=dtype)
    check(lambda a: a.var(), x)
    check(lambda a: a.var(1), x)
    check(lambda a: a.var(1, unbiased=False, keepdim=True), x)
    check(lambda a: torch.var(a, (0, 2), correction=0), x)
    check(lambda a: torch.var(a, 1, correction=2), x)
    check(lambda a: a.std(1), x)
    check(lambda a: a.std(), x)
    check(lambda a: torch.var_mean(a, 1, correction=0), x)
    check(lambda a: torch.var_mean(a, (0, 1), keepdim=True), x)
    check(lambda a: torch.std_mean(a, -1), x)
    check(lambda a: a.var(0), _noncontig(5, 3, dtype=dtype))


def test_var_edge_cases():
    check(lambda a: a.var(0), torch.ones(1, 3))     # n - correction == 0 -> nan
    check(lambda a: a.var(1), torch.zeros(2, 0))
    check(lambda a: a.var(), torch.tensor(2.0))
    check(lambda a: a.var(1), torch.randn(2, 3, dtype=torch.complex64))


def test_var_grad():
    x = _rand(3, 6).requires_grad_()
    check(lambda a: a.var(1), x, grad=True)
    check(lambda a: torch.var_mean(a, 1, correction=0), x, grad=True)


# -- logsumexp and norms -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_logsumexp(dtype):
    x = _rand(3, 5, 4, dtype=dtype)
    check(lambda a: a.logsumexp(1), x)
    check(lambda a: a.logsumexp((0, 2), keepdim=True), x)


def test_logsumexp_special():
    inf = float("inf")
    x = torch.tensor([[-inf, -inf], [inf, 1.0], [NAN, 1.0], [1000.0, 1000.0]])
    check(lambda a: a.logsumexp(1), x)
    check(lambda a: a.logsumexp(0), torch.tensor(1.5))
    check(lambda a: a.logsumexp(1), _rand(3, 4).requires_grad_(), grad=True)


@pytest.mark.parametrize("ord", [2, 1, 0, 3, 0.5, float("inf"), float("-inf")])
def test_vector_norm(ord):
    x = _rand(4, 5)
    check(lambda a: torch.linalg.vector_norm(a, ord), x)
    check(lambda a: torch.linalg.vector_norm(a, ord, dim=1, keepdim=True), x)
    check(lambda a: torch.linalg.vector_norm(a, ord, dim=(0, 1)), _noncontig(3, 4))


def test_vector_norm_dtypes_and_grad():
    check(lambda a: torch.linalg.vector_norm(a), _rand(4, 5, dtype=torch.bfloat16))
    check(lambda a: torch.linalg.vector_norm(a, dtype=torch.float64), _rand(4, 5))
    check(lambda a: torch.linalg.vector_norm(a, dim=1), torch.randn(3, 4, dtype=torch.complex64))
    check(lambda a: torch.linalg.vector_norm(a), torch.zeros(0))
    check(lambda a: torch.linalg.vector_norm(a, dim=1), _rand(3, 4).requires_grad_(), grad=True)


def test_norm_dist():
    x, y = _rand(3, 4), _rand(3, 4, seed=1)
    check(lambda a: torch.norm(a, 3, dim=1), x)
    check(lambda a: aten.norm.ScalarOpt_dim(a, None, [0]), x)
    check(lambda a: aten.norm.Scalar(a, 1), x)
    check(lambda a, b: torch.dist(a, b), x, y)
    check(lambda a, b: torch.dist(a, b, 1), x, y)
    check(lambda a, b: torch.dist(a, b, float("inf")), x, y)


# -- boolean reductions -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64, torch.uint8])
def test_all_any(dtype):
    x = _rand(3, 4, dtype=dtype) if dtype != torch.uint8 else torch.randint(0, 2, (3, 4)).to(dtype)
    check(torch.all, x)
    check(torch.any, x)
    check(lambda a: a.all(1), x)
    check(lambda a: a.any(0, keepdim=True), x)
    check(lambda a: aten.all.dims(a, [0, 1]), x)
    check(lambda a: aten.any.dims(a, [1], True), x)
    check(lambda a: aten.any.dims(a, []), x)


def test_all_any_edge_cases():
    check(torch.all, torch.zeros(0))
    check(torch.any, torch.zeros(0))
    check(lambda a: a.all(1), torch.tensor([[NAN, 1.0], [0.0, 1.0]]))
    check(aten._is_all_true.default, torch.tensor([True, True]))
    check(aten._is_any_true.default, torch.tensor([False, False]))


def test_count_nonzero():
    x = _rand(3, 4, dtype=torch.int64)
    check(torch.count_nonzero, x)
    check(lambda a: torch.count_nonzero(a, 1), x)
    check(lambda a: torch.count_nonzero(a, (0, 1)), x)


# -- order statistics -------------------------------------------------------------------------------
def _perm(*shape, seed=0):
    """Distinct values (no ties: the returned indices are then well defined)."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    return torch.randperm(n, generator=g).reshape(shape).float()


def test_median_kthvalue():
    x = _perm(4, 7)
    check(lambda a: torch.median(a, 1), x)
    check(lambda a: torch.median(a, 0, keepdim=True), _perm(6, 3))
    check(torch.median, x)
    check(lambda a: torch.kthvalue(a, 3, 1), x)
    check(lambda a: torch.kthvalue(a, 1, 0, keepdim=True), x)
    check(lambda a: torch.median(a, 1), _perm(3, 5).to(torch.int64))


def test_median_nan():
    x = torch.tensor([[3.0, 1, 3, 1, 2, NAN, 5, NAN], [4.0, 1, 2, 3, 0, 7, 8, 9]])
    check(lambda a: torch.median(a, 1), x)
    check(torch.median, x)
    check(lambda a: torch.nanmedian(a, 1), torch.tensor([[3.0, NAN, 1, 2, 5], [4.0, 1, 2, 0, 7]]))
    check(torch.nanmedian, x)
    check(lambda a: torch.nanmedian(a, 1)[0], torch.tensor([[NAN, NAN], [1.0, NAN]]))


def test_median_empty():
    """No elements: NaN (cast to the dtype, as CPU casts it), where tpu raised JAX's 'argmax of
    an empty sequence' (median) or returned 0 (nanmedian); a kept nonempty dim: empty results."""
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.uint8, torch.bool):
        e = torch.zeros(0, 3, dtype=dtype)
        check(torch.median, e)
        check(torch.nanmedian, e)
        if dtype != torch.bool:   # CPU has no bool median(dim) kernel
            check(lambda a: torch.median(a, 1), e)
            check(lambda a: torch.nanmedian(a, -1, keepdim=True), e)
    check(torch.median, torch.zeros(0))


def test_median_empty_dim_raises():
    msg = "median(): Expected reduction dim 0 to have non-zero size."
    e = torch.zeros(0, 3).to("tpu")
    for call in (lambda: e.median(0), lambda: e.nanmedian(0), lambda: e.median(-2, keepdim=True),
                 lambda: e.nanmedian(-2, keepdim=True), lambda: e[:, 0].nanmedian(0)):
        with pytest.raises(IndexError, match=re.escape(msg)):
            call()


def test_mode():
    y = torch.tensor([[2.0, 1, 2, 1, 3, 1, 2], [5.0, 5, 4, 4, 6, 6, 6]])
    check(lambda a: torch.mode(a, 1), y)
    check(lambda a: torch.mode(a, 0), torch.tensor([1, 2, 2, 1]))
    check(lambda a: torch.mode(a, 0, keepdim=True), torch.randint(0, 3, (9, 4)))


# -- scans ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + [torch.bool])
def test_cumsum(dtype):
    x = _rand(4, 6, dtype=dtype)
    check(lambda a: a.cumsum(1), x)
    check(lambda a: a.cumsum(0), x)
    check(lambda a: a.cumsum(0, dtype=torch.float64), x)
    check(lambda a: a.cumsum(1), _noncontig(3, 5, dtype=dtype))


def test_cumsum_edge_and_grad():
    check(lambda a: a.cumsum(0), torch.tensor(2.0))
    check(lambda a: a.cumsum(1), torch.zeros(2, 0))
    check(lambda a: a.cumsum(1), _rand(3, 5).requires_grad_(), grad=True)


def test_cumprod_logcumsumexp():
    x = _rand(3, 6)
    check(lambda a: a.cumprod(1), x)
    check(lambda a: a.cumprod(0), _rand(4, 3, dtype=torch.int64))
    check(lambda a: a.logcumsumexp(1), x)
    check(lambda a: a.logcumsumexp(0), torch.tensor([float("-inf"), 1.0, float("inf"), 2.0]))


@pytest.mark.parametrize("fn", [torch.cummax, torch.cummin])
def test_cummax_cummin(fn):
    check(lambda a: fn(a, 1), _rand(3, 6))
    check(lambda a: fn(a, 0), _rand(5, 2, dtype=torch.int64))
    check(lambda a: fn(a, 0), torch.tensor([1.0, 3, 3, NAN, 2, NAN, 1, 1]))
    check(lambda a: fn(a, 0), torch.tensor(1.5))


# -- comparisons returning Python bools -----------------------------------------------------------------
def test_allclose_equal():
    x = _rand(3, 4)
    check(lambda a, b: torch.allclose(a, b), x, x + 1e-9)
    check(lambda a, b: torch.allclose(a, b), x, x + 1e-3)
    check(lambda a, b: torch.allclose(a, b, equal_nan=True), torch.tensor([NAN]), torch.tensor([NAN]))
    check(lambda a, b: torch.equal(a, b), x, x.clone())
    check(lambda a, b: torch.equal(a, b), x, x + 1)
    check(lambda a, b: torch.equal(a, b), x, x[:2])


def _raised(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - compared with CPU's
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("fn, a, b", [
    (torch.allclose, torch.arange(3), torch.arange(3.0)),                    # dtypes differ
    (lambda a, b: torch.allclose(a, b, rtol=-1), torch.ones(2), torch.ones(2)),
    (lambda a, b: torch.allclose(a, b, atol=-0.5), torch.ones(2), torch.ones(2)),
    (torch.allclose, torch.ones(2, 3), torch.ones(2)),                       # no broadcast
])
def test_allclose_refuses_as_cpu(fn, a, b):
    """torch's isclose checks: an int tensor against a float one returned True before."""
    want = _raised(fn, a, b)
    assert want is not None and _raised(fn, a.to("tpu"), b.to("tpu")) == want


def test_renorm():
    x = _rand(4, 5) * 3
    check(lambda a: torch.renorm(a, 2, 0, 1.5), x)
    check(lambda a: torch.renorm(a, 1, 1, 2.0), x)
    check(lambda a: torch.renorm(a, float("inf"), 0, 1.0), _rand(3, 2, 4))
