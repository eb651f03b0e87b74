"""Parity tests for max/avg/adaptive/fractional pooling, unpooling and their backwards."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import check, to_tpu

aten = torch.ops.aten


def _r(*shape, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)


@pytest.mark.parametrize("kw", [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(2, 3), stride=(1, 2), dilation=(2, 1)),
])
def test_max_pool2d(kw):
    x = _r(2, 3, 7, 9, grad=True)
    check(lambda x: F.max_pool2d(x, return_indices=True, **kw), x, grad=True)


def test_max_pool2d_special_values_and_layouts():
    x = _r(2, 3, 6, 5)
    x[0, 0, 1, 1] = float("nan")
    x[1, 1] = float("-inf")
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x)
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), _r(3, 6, 5))                 # unbatched
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), _r(2, 3, 5, 6).transpose(2, 3))
    check(lambda x: F.max_pool2d(x, 2, 1, return_indices=True), _r(2, 3, 5, 6, dtype=torch.bfloat16,
                                                                    grad=True), grad=True)
    check(lambda x: F.max_pool1d(x, 3, 2, 1, ceil_mode=True, return_indices=True), _r(2, 3, 8, grad=True),
          grad=True)


def test_pool_zero_batch():
    x = _r(0, 3, 4, 4)
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), x)
    check(lambda x: F.avg_pool2d(x, 2), x)
    check(lambda x: F.adaptive_avg_pool2d(x, (2, 3)), x)
    # the max-pool lowerings that gather from flattened planes (reshape(..., -1) cannot
    # infer a size next to a 0): adaptive, fractional, unpooling
    check(lambda x: F.adaptive_max_pool2d(x, (2, 3), return_indices=True), x)
    check(lambda x, s: F.fractional_max_pool2d(x, 2, output_size=2, return_indices=True, _random_samples=s),
          x, torch.rand(0, 3, 2))
    check(lambda x, s: F.fractional_max_pool3d(x, 2, output_size=2, return_indices=True, _random_samples=s),
          _r(0, 1, 4, 5, 4), torch.rand(0, 1, 3))
    y, idx = F.max_pool2d(x, 2, return_indices=True)
    check(lambda y, i: F.max_unpool2d(y, i, 2), y, idx)


def test_max_pool3d():
    check(lambda x: F.max_pool3d(x, (2, 3, 2), (1, 2, 2), (1, 1, 0), return_indices=True),
          _r(2, 2, 4, 5, 6, grad=True), grad=True)


@pytest.mark.parametrize("kw", [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), divisor_override=5),
    # a window far wider than the input (EfficientNet's head: AvgPool2d(2560, ceil_mode=True)
    # as a global pool): summed over the input only, not over 2560x2560 of padding
    dict(kernel_size=2560, ceil_mode=True),
    dict(kernel_size=(12, 9), stride=(3, 2), padding=(4, 2), ceil_mode=True, count_include_pad=False),
])
def test_avg_pool2d(kw):
    check(lambda x: F.avg_pool2d(x, **kw), _r(2, 3, 7, 8, grad=True), grad=True)


def test_avg_pool_1d_3d_bf16():
    check(lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), _r(2, 3, 10, grad=True),
          grad=True)
    check(lambda x: F.avg_pool3d(x, 2, (1, 2, 2), 1, ceil_mode=True), _r(1, 2, 4, 5, 5, grad=True), grad=True)
    check(lambda x: F.avg_pool2d(x, 2), _r(3, 6, 6, dtype=torch.bfloat16, grad=True), grad=True)


@pytest.mark.parametrize("size", [(3, 4), (1, 1), (7, 5), (2, 3)])
def test_adaptive_avg_pool2d(size):
    check(lambda x: F.adaptive_avg_pool2d(x, size), _r(2, 3, 7, 5, grad=True), grad=True)


def test_adaptive_avg_1d_3d():
    check(lambda x: F.adaptive_avg_pool1d(x, 4), _r(2, 3, 10, grad=True), grad=True)
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)), _r(1, 2, 5, 7, 3, grad=True), grad=True)
    check(lambda x: aten._adaptive_avg_pool2d(x, [3, 2]), _r(3, 6, 5, dtype=torch.bfloat16))


def test_adaptive_max_pool():
    check(lambda x: F.adaptive_max_pool2d(x, (3, 4), return_indices=True), _r(2, 3, 7, 9, grad=True), grad=True)
    check(lambda x: F.adaptive_max_pool3d(x, (2, 3, 2), return_indices=True), _r(1, 2, 5, 7, 3, grad=True),
          grad=True)
    check(lambda x: F.adaptive_max_pool1d(x, 3, return_indices=True), _r(2, 7, grad=True), grad=True)


def test_fractional_max_pool():
    samples = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(1))
    check(lambda x, s: F.fractional_max_pool2d(x, 2, output_size=(4, 5), return_indices=True, _random_samples=s),
          _r(2, 3, 9, 10, grad=True), samples, grad=True)
    # forward only: torch has no meta kernel for fractional_max_pool3d_backward, which the
    # dispatcher needs (and an error in the autograd thread aborts the process)
    samples3 = torch.rand(1, 2, 3, generator=torch.Generator().manual_seed(2))
    check(lambda x, s: F.fractional_max_pool3d(x, (2, 2, 3), output_size=(3, 4, 2), return_indices=True,
                                               _random_samples=s),
          _r(1, 2, 6, 7, 6), samples3)
    # 3-d takes its samples in (T, H, W) order, 2-d in (W, H): sizes where the order shows
    samples3 = torch.rand(1, 3, 3, generator=torch.Generator().manual_seed(5))
    check(lambda x, s: F.fractional_max_pool3d(x, (2, 3, 2), output_size=(4, 3, 5), return_indices=True,
                                               _random_samples=s),
          _r(1, 3, 7, 8, 9), samples3)


def test_max_unpool():
    x = _r(2, 3, 6, 8)
    y, idx = F.max_pool2d(x, 2, return_indices=True)
    check(lambda y, i: F.max_unpool2d(y, i, 2), y, idx)
    check(lambda y, i: F.max_unpool2d(y, i, 2, output_size=(7, 9)), y, idx)
    x3 = _r(1, 2, 4, 4, 6)
    y3, idx3 = F.max_pool3d(x3, 2, return_indices=True)
    check(lambda y, i: F.max_unpool3d(y, i, 2), y3, idx3)


@pytest.mark.parametrize("nd", [2, 3])
def test_max_unpool_bad_index_raises_at_sync(nd):
    """An index outside the output: CPU raises; XLA's scatter dropped it silently. On tpu
    the check rides with the result and raises at the next sync (as CUDA's assert would)."""
    pool, unpool = (F.max_pool2d, F.max_unpool2d) if nd == 2 else (F.max_pool3d, F.max_unpool3d)
    y, idx = pool(_r(1, 2, *(4,) * nd), 2, return_indices=True)
    for bad in (idx + 4 ** nd, idx - 100):
        with pytest.raises(RuntimeError, match="Found an invalid max index"):
            unpool(y, bad, 2)
        with pytest.raises(RuntimeError, match="Found an invalid max index"):
            unpool(to_tpu(y), to_tpu(bad), 2).cpu()
