"""Parity of the histogram lowerings (registry/xla/histogram.py) with CPU torch."""
from __future__ import annotations

import re

import pytest
import torch
from helpers import check, to_tpu

from tpu_kernels import errors


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


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
    check(lambda a, w: torch.bincount(a, w, minlength=3), torch.zeros(0, dtype=torch.int64), torch.zeros(0))
    check(lambda a, w: torch.bincount(a, w, minlength=9), x.int(), torch.arange(6))   # int weights: float64


BINCOUNT_INPUTS = "bincount only supports 1-d non-negative integral inputs."


def test_bincount_of_negative_values_raises_at_the_next_sync():
    x = torch.tensor([0, -1, 2])
    for w in (None, torch.ones(3)):
        with pytest.raises(RuntimeError, match=re.escape(BINCOUNT_INPUTS)):
            torch.bincount(x, w)
        with pytest.raises(RuntimeError, match=re.escape(BINCOUNT_INPUTS)):
            torch.bincount(to_tpu(x), to_tpu(w)).cpu()
    with errors.set_sync_checks(True):   # raised by the call itself
        with pytest.raises(RuntimeError, match=re.escape(BINCOUNT_INPUTS)):
            torch.bincount(to_tpu(x))
    assert torch.bincount(to_tpu(torch.tensor([2, 0, 2]))).tolist() == [1, 0, 2]   # later calls work


@pytest.mark.parametrize("args, kwargs, exc, message", [
    ((torch.tensor([[1, 2]]),), {}, RuntimeError, BINCOUNT_INPUTS),
    ((torch.tensor([1, 2]),), {"minlength": -1}, RuntimeError, "minlength should be >= 0"),
    ((torch.tensor([1, 2]), torch.ones(3)), {}, RuntimeError,
     "weights should be 1-d and have the same length as input"),
    ((torch.tensor([1.0, 2.0]),), {}, NotImplementedError, "\"bincount_cpu\" not implemented for 'Float'"),
])
def test_bincount_bad_arguments_raise_as_cpu(args, kwargs, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        torch.bincount(*args, **kwargs)
    with pytest.raises(exc, match=re.escape(message)):
        torch.bincount(*to_tpu(args), **kwargs).cpu()


def test_histogram():
    x = _rand(60)
    check(lambda a: torch.histogram(a, 6), x)
    check(lambda a: torch.histogram(a, 4, range=(-1.0, 1.0), density=True), x)
    check(lambda a, w: torch.histogram(a, 5, weight=w), x, _rand(60, seed=1).abs())
    check(lambda a, b: torch.histogram(a, b), x, torch.tensor([-3.0, -0.5, 0.0, 0.25, 3.0]))
    check(lambda a: torch.histogram(a, 3), torch.tensor([2.0, 2.0]))  # constant data widens by 0.5
    check(lambda a: torch.histogram(a, 4), torch.zeros(0))            # no data: edges over [0, 1]


def test_histogramdd():
    pts = _rand(50, 3)
    check(lambda a: torch.histogramdd(a, [3, 4, 2]), pts)
    check(lambda a: torch.histogramdd(a, [2, 2, 2], range=[-1.0, 1.0, 0.0, 2.0, -2.0, 0.0], density=True), pts)
    check(lambda a, w: torch.histogramdd(a, [4, 3, 2], weight=w), pts, _rand(50, seed=2).abs())
    edges = [torch.tensor([-2.0, 0.0, 2.0]), torch.tensor([-1.0, 1.0]), torch.tensor([-3.0, -1.0, 0.0, 3.0])]
    check(lambda a, *b: torch.histogramdd(a, list(b)), pts, *edges)
    check(lambda a: torch.histogramdd(a, [2, 3]), _rand(4, 5, 2))       # leading dims are points
    check(lambda a: torch.histogramdd(a, [2, 2]), torch.zeros(0, 2))
