"""Parity of the sorting lowerings (registry/xla/sorting.py) with CPU torch."""
from __future__ import annotations

import re

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


def _ties(rows: int, n: int, levels: int, seed: int = 0) -> torch.Tensor:
    """Rows of small integers (many equal values), some with NaNs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (rows, n), generator=g).float()
    x[0] = 0.5                      # a whole row of ties (a router gate initialised to zero)
    x[1, ::3] = NAN
    return x


# torch's CPU topk among equal values: libstdc++'s nth_element + sort (k * 64 > n) or
# partial_sort (k * 64 <= n), replayed by registry/xla/_cpu_order.py (each case compiles the
# replay once: a few seconds)
@pytest.mark.parametrize("n,k,levels,largest,srt", [
    (4, 2, 2, True, True),      # a 4-expert router, top-2: the AFMoE case
    (4, 2, 2, True, False),     # the same with sorted=False (routers often ask for it)
    (8, 3, 3, False, True),     # nth_element, several partition rounds, smallest first
    (40, 19, 4, True, True),    # k - 1 > 16: std::sort partitions before its insertion sort
    (128, 2, 5, True, True),    # k * 64 <= n: partial_sort (heap selection)
])
def test_topk_ties_follow_cpu(n, k, levels, largest, srt):
    check(lambda a: torch.topk(a, k, largest=largest, sorted=srt), _ties(12, n, levels))


@pytest.mark.thorough
@pytest.mark.parametrize("n", [4, 5, 8, 16, 33, 64, 100, 128, 300])
def test_topk_ties_follow_cpu_sweep(n):
    for k in sorted({1, 2, 3, 5, 17, 18, n // 2, n - 1, n} & set(range(1, n + 1))):
        for largest in (True, False):
            for srt in (True, False):
                for levels in (1, 2, 3, n):
                    check(lambda a, k=k, big=largest, srt=srt: torch.topk(a, k, largest=big, sorted=srt),
                          _ties(8, n, levels, seed=k))


def test_topk_unsorted_order_and_bf16_ties():
    # sorted=False with distinct values: the order nth_element leaves, not a sorted one
    x = _distinct(6, 10)
    check(lambda a: torch.topk(a, 4, sorted=False), x)
    check(lambda a: torch.topk(a, 3, dim=0, sorted=False), x)
    # bfloat16 rounding makes ties; the CPU kernel compares in float
    check(lambda a: torch.topk(a, 3), (torch.randn(6, 10, generator=torch.Generator().manual_seed(3))
                                       * 0.02).to(torch.bfloat16))


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
    check(lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True), torch.tensor(2.5))
    check(lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True), x)
    m = torch.tensor([[1, 1], [1, 1], [2, 0], [2, 0], [1, 1]])
    check(lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True, dim=0), m)
    check(lambda a: torch.unique_consecutive(a, dim=1), m.t())


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bfloat16, torch.bool])
def test_unique_dim(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 2 if dtype == torch.bool else 3, (10, 3), generator=g).to(dtype)  # repeated rows
    full = dict(return_inverse=True, return_counts=True)
    check(lambda a: torch.unique(a, dim=0, **full), x)
    check(lambda a: torch.unique(a, dim=1, **full), x.t())      # a dim that is not 0
    check(lambda a: torch.unique(a, dim=-2, return_counts=True), x.reshape(2, 5, 3))
    check(lambda a: torch.unique(a, dim=1, sorted=False, **full), x.reshape(2, 5, 3))
    check(lambda a: torch.unique(a, dim=0), x[:, :1].reshape(-1))   # one column: plain unique


def test_unique_dim_values_and_edges():
    # lexicographic order over floats with negatives; -0.0 equals 0.0
    x = torch.tensor([[0.0, 1.5], [-0.5, 2.0], [-0.0, 1.5], [-0.5, -2.0], [-0.5, 2.0]])
    check(lambda a: torch.unique(a, dim=0, return_inverse=True, return_counts=True), x)
    # rows holding a NaN are all distinct (where CPU sorts them among others is unspecified)
    check(lambda a: torch.unique(a, dim=0, return_counts=True), torch.tensor([[NAN, 1.0], [NAN, 1.0]]))
    # without the flags unique_dim still returns the inverse and the counts (as CPU does)
    check(lambda a: aten.unique_dim(a, 0), torch.tensor([[3, 1], [1, 2], [3, 1], [0, 5]]))
    check(lambda a: aten.unique_dim(a, 0, True, True, True), torch.zeros(0, 3))
    check(lambda a: aten.unique_dim(a, 1, True, True, True), torch.zeros(3, 0))
    for t, d, exc in [(torch.zeros(3, 0), 0, RuntimeError), (torch.zeros(0, 0), 1, RuntimeError),
                      (torch.ones(2, 3), 2, IndexError), (torch.tensor(1.0), 0, IndexError)]:
        with pytest.raises(exc) as cpu:
            torch.unique(t, dim=d)
        with pytest.raises(exc, match=re.escape(str(cpu.value).split("\n")[0])):
            torch.unique(t.to("tpu"), dim=d)


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
