"""Parity tests for the shape lowerings (registry/xla/shape.py)."""
from __future__ import annotations

import pytest
import torch
from helpers import check

aten = torch.ops.aten
F32, BF16 = torch.float32, torch.bfloat16


def r(*shape, dtype=F32, grad=False):
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    if dtype in (torch.int64, torch.int32):
        return torch.randint(-5, 6, shape, generator=g, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    x = torch.randn(shape, generator=g).to(dtype)
    return x.requires_grad_() if grad else x


@pytest.mark.parametrize("dtype", [F32, BF16, torch.int64])
def test_cat_stack(dtype):
    a, b = r(2, 3, dtype=dtype), r(5, 3, dtype=dtype)
    check(lambda a, b: torch.cat([a, b]), a, b)
    check(lambda a, b: torch.cat([a, b.t().t()], dim=-2), a, b)
    check(lambda a, b: torch.stack([a, a, a], dim=1), a, b)
    check(lambda a, b: torch.stack([a, b[:2]], dim=-1), a, b)


def test_cat_empty_promotion_and_grad():
    a, b = r(2, 3, grad=True), r(0, 3)
    check(lambda a, b, e: torch.cat([a, e, b, a.to(torch.float64)]), a, b, torch.empty(0))
    check(lambda a, c: torch.cat([a, c], 1), a, r(2, 1, dtype=torch.int64))
    check(lambda a, b: torch.cat([a * 2, b, a], 0), a, b, grad=True)
    check(lambda a: torch.stack([a, a * 3], 0), a, grad=True)
    check(lambda e: torch.cat([e, e]), r(0, 4))


def test_unsafe_view_and_copies():
    x = r(2, 3, 4)
    check(lambda x: aten._unsafe_view(x, [6, 4]), x)
    check(lambda x: aten.view_copy(x, [4, 6]), x)
    check(lambda x: aten.t_copy(x[0]), x)
    check(lambda x: aten.permute_copy(x, [2, 0, 1]), x)
    check(lambda x: aten.expand_copy(x[:, :1], [5, 2, 3, 4]), x)
    check(lambda x: aten.transpose_copy(x, 0, -1), x)
    check(lambda x: aten.unsqueeze_copy(x, -1), x)
    check(lambda x: aten.squeeze_copy(x[:, :1]), x)
    check(lambda x: aten.squeeze_copy.dim(x[:, :1], 1), x)
    check(lambda x: aten.squeeze_copy.dims(x[:1, :1], [0, 1]), x)
    check(lambda x: aten.diagonal_copy(x, 1, 1, 2), x)
    check(lambda x: aten.diagonal_copy(x, -1, 0, 2), x)
    check(lambda x: aten.alias_copy(x), x)
    check(lambda x: aten.split_with_sizes_copy(x, [1, 3], -1), x)
    check(lambda x: aten.unbind_copy(x, 1), x)
    check(lambda x: aten.unsafe_split(x, 3, -1), x)
    check(lambda x: aten.split_copy(x, 2, 1), x)
    check(lambda x: aten.unsafe_split_with_sizes(x, [2, 0, 2], 2), x)
    check(lambda x: aten.unfold_copy(x, 2, 2, 1), x)
    check(lambda x: aten.unfold_copy(x, 1, 2, 2), x)
    check(lambda x: aten.narrow_copy(x, 2, 1, 2), x)
    check(lambda x: aten.narrow_copy(x, -1, -3, 2), x)
    check(lambda x: aten.select_copy(x, 1, -1), x)       # (scan's and map's eager backward)
    check(lambda x: aten.slice_copy(x, 2, 1, None, 2), x)
    check(lambda x: aten.slice_copy(x, -1, -100, 100), x)
    check(lambda x: aten.slice_copy(x, 0, 4, 2), x)       # (empty)
    check(lambda x: aten.as_strided_copy(x, [3, 2], [2, 5], 1), x)
    check(lambda x: aten.t_copy(x), r(5))


def test_backward_of_views():
    g = r(2, 2, 4)
    check(lambda g: aten.slice_backward(g, [2, 5, 4], 1, 1, 5, 2), g)
    check(lambda g: aten.slice_backward(g, [2, 3, 4], 1, -2, 9223372036854775807, 1), g)
    check(lambda g: aten.select_backward(g, [2, 3, 2, 4], 1, -1), g)
    check(lambda g: aten.unfold_backward(g, [2, 5], 1, 4, 1), g.reshape(2, 2, 4))
    check(lambda g: aten.unfold_backward(g, [7, 2], 0, 4, 3), r(2, 2, 4))
    x = r(3, 6, grad=True)
    check(lambda x: x[:, 1:5:2] * 2, x, grad=True)
    check(lambda x: x[1] * 2, x, grad=True)
    check(lambda x: x.unfold(1, 3, 2) * 2, x, grad=True)
    # a zero-size window (and an empty batch): nothing to infer a -1 reshape from
    check(lambda x: x.unfold(1, 0, 2) * 2, x, grad=True)
    check(lambda x: x.unfold(1, 0, 2) * 2, r(0, 3, 4, grad=True), grad=True)


def test_scatters_into_views():
    x, bf = r(4, 5), r(4, 5, dtype=BF16)
    check(lambda x, s: aten.slice_scatter(x, s, 1, 1, 5, 2), x, r(4, 2))
    check(lambda x, s: aten.select_scatter(x, s, 0, -1), x, r(5))
    check(lambda x, s: aten.diagonal_scatter(x, s, 1), x, r(4))
    check(lambda x, s: aten.diagonal_scatter(x, s, -2), x, r(2))
    check(lambda x, s: aten.diagonal_scatter(x, s, 0, 1, 0), bf, r(4, dtype=BF16))
    check(lambda x, s: aten.as_strided_scatter(x, s, [2, 2], [5, 1], 3), x, r(2, 2))


def test_diag_embed_block_diag_chunk_cat():
    check(lambda x: torch.diag_embed(x), r(2, 3))
    check(lambda x: torch.diag_embed(x, 1, 0, 2), r(2, 3))
    check(lambda x: torch.diag_embed(x, -1, 2, 0), r(2, 3))
    check(lambda a, b, c: torch.block_diag(a, b, c), r(2, 3), r(4), r(3, 1, dtype=torch.int64))
    check(lambda a, b: aten._chunk_cat([a, b], 1, 3), r(2, 4, 3), r(2, 5))
    check(lambda a, b: aten._chunk_cat([a, b], 0, 2), r(3, 2), r(4))


@pytest.mark.parametrize("dtype", [F32, BF16, torch.int64, torch.bool])
def test_flip_roll_rot90_repeat(dtype):
    x = r(3, 4, 5, dtype=dtype)
    nc = x.transpose(0, 2)
    check(lambda x: torch.flip(x, [0, -1]), x)
    check(lambda x: torch.flip(x, [1]), nc)
    check(lambda x: torch.roll(x, 2), x)
    check(lambda x: torch.roll(x, (1, -3), (0, 2)), nc)
    check(lambda x: torch.rot90(x, 1, [0, 1]), x)
    check(lambda x: torch.rot90(x, -3, [2, 0]), x)
    check(lambda x: x.repeat(2, 1, 1, 3), x)
    check(lambda x: x.repeat(1, 0, 2), nc)
    check(lambda x: x.repeat(2), r(dtype=dtype))


def test_flip_repeat_grad():
    x = r(3, 4, grad=True)
    check(lambda x: torch.flip(x, [1]) * 2, x, grad=True)
    check(lambda x: x.repeat(2, 3), x, grad=True)


@pytest.mark.parametrize("dtype", [F32, BF16, torch.int64])
def test_tril_triu(dtype):
    x = r(2, 4, 5, dtype=dtype)
    for k in (0, 1, -2, 7):
        check(lambda x: torch.tril(x, k), x)
        check(lambda x: torch.triu(x, k), x)
    check(lambda x: torch.triu(x.transpose(1, 2)), x)
    check(lambda x: torch.tril(x), r(0, 3, dtype=dtype))


def test_tril_grad():
    check(lambda x: torch.tril(x, -1), r(4, 4, grad=True), grad=True)


@pytest.mark.parametrize("dtype", [F32, BF16, torch.int64])
def test_constant_pad_nd(dtype):
    x = r(2, 3, 4, dtype=dtype)
    check(lambda x: aten.constant_pad_nd(x, [1, 2]), x)
    check(lambda x: aten.constant_pad_nd(x, [1, 0, 0, 2], 3), x)
    check(lambda x: aten.constant_pad_nd(x, [-1, 2, 1, -1, 0, 1], -1), x)
    check(lambda x: aten.constant_pad_nd(x, []), x)
    check(lambda x: torch.nn.functional.pad(x, (2, 2)), x.transpose(0, 2))


def test_constant_pad_grad():
    check(lambda x: torch.nn.functional.pad(x, (1, 2, -1, 1), value=1.5), r(3, 4, grad=True), grad=True)


def test_shuffles():
    x = r(2, 8, 3, 3)
    check(lambda x: torch.nn.functional.pixel_shuffle(x, 2), x)
    check(lambda x: torch.nn.functional.pixel_unshuffle(x, 3), r(2, 2, 6, 3))
    check(lambda x: torch.nn.functional.pixel_unshuffle(x, 2), r(3, 2, 2, 4, 6))
    check(lambda x: torch.channel_shuffle(x, 4), x)
    check(lambda x: torch.nn.functional.pixel_shuffle(x, 2), r(1, 4, 2, 3, grad=True), grad=True)


def test_repeat_interleave_tensor():
    check(lambda rp: torch.repeat_interleave(rp), torch.tensor([2, 0, 3, 1]))
    check(lambda x, rp: torch.repeat_interleave(x, rp, dim=0), r(4, 2), torch.tensor([2, 0, 3, 1]))
    check(lambda x: torch.repeat_interleave(x, 2, dim=1), r(3, 2))
    check(lambda rp: torch.repeat_interleave(rp), torch.zeros(0, dtype=torch.int64))


def test_complex_polar():
    a, b = r(3, 4), r(3, 4)
    check(lambda a, b: torch.complex(a, b), a, b)
    check(lambda a, b: torch.complex(a, b), a.double(), r(4).double())
    check(lambda a, b: torch.polar(a.abs(), b), a, b)


# -- factories added to creation.py ---------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, torch.int64, torch.float64])
def test_eye_linspace_logspace(dtype):
    from helpers import assert_same
    for fn in (lambda d: torch.eye(3, dtype=dtype, device=d), lambda d: torch.eye(2, 5, dtype=dtype, device=d),
               lambda d: torch.linspace(-3, 10, 7, dtype=dtype, device=d),
               lambda d: torch.linspace(0, 1, 1, dtype=dtype, device=d),
               lambda d: torch.linspace(2, 5, 0, dtype=dtype, device=d),
               lambda d: torch.logspace(0, 3, 4, dtype=dtype, device=d),
               lambda d: torch.logspace(-1, 2, 5, base=2.0, dtype=dtype, device=d)):
        assert_same(fn("cpu"), fn("tpu"))
    assert_same(torch.linspace(0, 1, 11), torch.linspace(0, 1, 11, device="tpu"))
    check(lambda s, e: torch.linspace(s, e, 9, dtype=dtype), torch.tensor(-2.0), torch.tensor(3.0))
    check(lambda s: torch.logspace(s, 2.0, 4, dtype=dtype), torch.tensor(-1.0))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_logspace_integer_truncates_end_points(dtype):
    # torch truncates start/end to the integer dtype first: logspace(2.5, 0, 2, base=2) is [4, 1]
    check(lambda: torch.logspace(2.5, 0, 2, 2.0, dtype=dtype))
    check(lambda s, e: torch.logspace(s, e, 33, dtype=dtype), torch.tensor(0.661), torch.tensor(0.9848))
    check(lambda: torch.logspace(-1.7, 3.9, 5, 3.0, dtype=dtype))


def test_tri_indices():
    from helpers import assert_same
    for args in ((4, 3), (3, 5, 1), (5, 4, -2), (0, 3)):
        assert_same(torch.tril_indices(*args), torch.tril_indices(*args, device="tpu"))
        assert_same(torch.triu_indices(*args), torch.triu_indices(*args, device="tpu"))
