"""Parity of the sorting lowerings (registry/xla/sorting.py) with CPU torch."""
from __future__ import annotations

import pytest
import torch
from helpers import check

aten = torch.ops.aten
NAN, INF = float("nan"), float("inf")


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def _distinct(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    return (torch.randperm(n, generator=g).reshape(shape) - n // 2).to(dtype)


# -- sort -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(dtype, descending):
    x = _rand(4, 9, dtype=dtype)  # bf16 and ints have ties: indices check stability
    check(lambda a: torch.sort(a, descending=descending), x)
    check(lambda a: torch.sort(a, 0, descending=descending), x)
    check(lambda a: torch.sort(a, stable=True, dim=1, descending=descending), x)
    check(lambda a: torch.sort(a, 0, descending=descending), x.t())


def test_sort_special_values():
    x = torch.tensor([0.0, -0.0, 1, NAN, -INF, INF, -0.0, -NAN, 1, 0.0])
    for desc in (False, True):
        check(lambda a: torch.sort(a, stable=True, descending=desc), x)
        check(lambda a: torch.argsort(a, descending=desc, stable=True), x)


def test_sort_edge_cases():
    check(lambda a: torch.sort(a), torch.tensor(3.0))
    check(lambda a: torch.sort(a, 1), torch.zeros(3, 0))
    check(lambda a: torch.sort(a), torch.tensor([True, False, True, False]))
    check(lambda a: torch.sort(a, descending=True), torch.tensor([True, False, True, False]))
    iinfo = torch.iinfo(torch.int64)
    check(lambda a: torch.sort(a, descending=True), torch.tensor([0, iinfo.min, iinfo.max, -1]))


def test_sort_grad():
    check(lambda a: torch.sort(a, 1)[0], _distinct(3, 5).requires_grad_(), grad=True)


# -- topk ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_topk(dtype):
    # distinct values: torch's CPU topk picks among ties in an unspecified order
    x = _distinct(5, 11, dtype=dtype)
    check(lambda a: torch.topk(a, 3), x)
    check(lambda a: torch.topk(a, 2, 0), x)
    check(lambda a: torch.topk(a, 4, largest=False), x)
    check(lambda a: torch.topk(a, 11), x)
    check(lambda a: torch.topk(a, 0), x)
    check(lambda a: torch.topk(a, 3, 0), x.t())


def test_topk_nan_and_grad():
    x = torch.tensor([[1.0, NAN, 3.0, -2.0, 5.0]])
    check(lambda a: torch.topk(a, 2), x)
    check(lambda a: torch.topk(a, 2, largest=False), x)
    check(lambda a: torch.topk(a, 3)[0], _distinct(3, 6).requires_grad_(), grad=True)


# -- searchsorted / bucketize ----------------------------------------------------------------------
@pytest.mark.parametrize("right", [False, True])
def test_searchsorted(right):
    seq = torch.tensor([1.0, 2.0, 2.0, 4.0, 7.0])
    vals = torch.tensor([[0.0, 2.0, 3.0], [7.0, 8.0, 1.0]])
    check(lambda s, v: torch.searchsorted(s, v, right=right), seq, vals)
    check(lambda s, v: torch.searchsorted(s, v, side="right" if right else "left", out_int32=True), seq, vals)
    batched = torch.sort(_rand(2, 6), 1)[0]
    check(lambda s, v: torch.searchsorted(s, v, right=right), batched, _rand(2, 4, seed=1))
    perm = torch.tensor([3, 0, 4, 1, 2])
    check(lambda s, v, p: torch.searchsorted(s, v, sorter=p), seq[perm.argsort()], vals, perm)
    check(lambda s: torch.searchsorted(s, 2.0, right=right), seq)
    check(lambda v, b: torch.bucketize(v, b, right=right), vals, seq)
    check(lambda v, b: torch.bucketize(v, b, out_int32=True), vals.to(torch.int64), seq.to(torch.int64))
    check(lambda b: torch.bucketize(3.0, b, right=right), seq)


# -- histograms ---------------------------------------------------------------------------------------
def test_histc():
    x = _rand(100)
    check(lambda a: torch.histc(a, 10, -2, 2), x)
    check(lambda a: torch.histc(a, 7), x)                # min == max: the data's range
    check(lambda a: torch.histc(a, 4, 0, 3), torch.tensor([0.0, 1.0, 2.0, 3.0, 3.0, -1.0, 4.0]))
    check(lambda a: torch.histc(a, 3), torch.tensor([2.0, 2.0]))  # constant data widens by 1
    check(lambda a: torch.histc(a, 5, -1, 1), _rand(40, dtype=torch.float64))


def test_bincount():
    x = torch.tensor([0, 3, 1, 3, 3, 7])
    check(torch.bincount, x)
    check(lambda a: torch.bincount(a, minlength=10), x)
    check(lambda a, w: torch.bincount(a, w), x, _rand(6))
    check(lambda a, w: torch.bincount(a, w), x, _rand(6, dtype=torch.float64))
    check(lambda a: torch.bincount(a), torch.zeros(0, dtype=torch.int64))


# -- unique ------------------------------------------------------------------------------------------------
def test_unique():
    x = torch.tensor([[3, 1, 3], [2, 2, 7]])
    check(lambda a: torch.unique(a), x)
    check(lambda a: torch.unique(a, return_inverse=True, return_counts=True), x)
    check(lambda a: torch.unique(a, return_counts=True), _rand(20).round())
    check(lambda a: torch.unique(a), torch.zeros(0))


def test_unique_consecutive():
    x = torch.tensor([3, 3, 1, 3, 2, 2, 2])
    check(lambda a: torch.unique_consecutive(a), x)
    check(lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True), x)
    m = torch.tensor([[1, 1], [1, 1], [2, 0], [2, 0], [1, 1]])
    check(lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True, dim=0), m)
    check(lambda a: torch.unique_consecutive(a, dim=1), m.t())


def test_histogram():
    x = _rand(50)
    check(lambda a: torch.histogram(a, 6), x)
    check(lambda a: torch.histogram(a, 4, range=(-1.0, 1.0)), x)
    check(lambda a, w: torch.histogram(a, 5, weight=w, density=True), x, _rand(50, seed=1).abs())
    check(lambda a: torch.histogram(a, 4), torch.full((5,), 2.0))
    check(lambda a, b: torch.histogram(a, b), torch.tensor([0.0, 1, 2, 3, 4, 9]), torch.tensor([0.0, 1, 3, 4]))


def test_topk_special_values():
    x = torch.tensor([[0.5, -INF, INF, NAN, -3.0, -0.0, 2.0, -1e-30, 1e-30]])
    for largest in (True, False):
        for k in (1, 4, 9):
            check(lambda a: torch.topk(a, k, largest=largest), x)
    i = torch.iinfo(torch.int64)
    check(lambda a: torch.topk(a, 2, largest=False), torch.tensor([5, i.min, i.max, -1]))
    check(lambda a: torch.topk(a, 2), _distinct(4, 5, dtype=torch.float64))
    check(lambda a: torch.topk(a, 2), _distinct(4, 5, dtype=torch.int16))
