"""Parity tests for upsampling (nearest, linear family, bicubic, antialiased), grid_sampler
and reflection/replication padding, with their backwards."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import check

aten = torch.ops.aten


def _r(*shape, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)


SIZES = [dict(size=(8, 11)), dict(size=(3, 4)), dict(scale_factor=(1.7, 2.3)), dict(scale_factor=2)]


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bicubic"])
def test_upsample2d(mode):
    x = _r(2, 3, 5, 7, grad=True)
    for kw in SIZES:
        for ac in ([None] if mode.startswith("nearest") else [False, True]):
            check(lambda x: F.interpolate(x, mode=mode, align_corners=ac, **kw), x, grad=True,
                  msg=f"{mode} {kw} align_corners={ac}")


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_upsample2d_antialias(mode):
    x = _r(2, 3, 9, 7, grad=True)
    for kw in (dict(size=(4, 3)), dict(scale_factor=0.4), dict(size=(12, 10))):
        for ac in (False, True):
            check(lambda x: F.interpolate(x, mode=mode, align_corners=ac, antialias=True, **kw), x, grad=True,
                  msg=f"{mode} {kw} align_corners={ac}")


def test_upsample_1d_3d():
    x1 = _r(2, 3, 7, grad=True)
    for mode in ("nearest", "nearest-exact", "linear"):
        check(lambda x: F.interpolate(x, size=12, mode=mode), x1, grad=True, msg=mode)
    check(lambda x: F.interpolate(x, scale_factor=0.6, mode="linear", align_corners=True), x1, grad=True)
    x3 = _r(1, 2, 3, 4, 5, grad=True)
    for mode in ("nearest", "trilinear"):
        check(lambda x: F.interpolate(x, scale_factor=1.5, mode=mode), x3, grad=True, msg=mode)


def test_upsample_dtypes_layouts():
    xb = _r(2, 3, 4, 5, dtype=torch.bfloat16, grad=True)
    check(lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"), xb, grad=True)
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), xb, grad=True)
    xu = torch.randint(0, 255, (1, 3, 4, 5), dtype=torch.uint8)
    check(lambda x: F.interpolate(x, size=(9, 7), mode="nearest"), xu)
    check(lambda x: F.interpolate(x, size=(6, 9), mode="bilinear"), _r(2, 3, 5, 4).transpose(2, 3))
    check(lambda x: aten.upsample_bilinear2d(x, [6, 8], False, None, None), _r(0, 3, 4, 5))


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_upsample_nearest1d_empty_batch(mode):
    """torch's meta function for upsample_nearest1d passes torch._check an int when the batch
    is empty (TypeError); the op raised 'no meta kernel' instead of returning (0, C, L')."""
    check(lambda x: F.interpolate(x, scale_factor=2, mode=mode), _r(0, 2, 4, grad=True), grad=True)
    check(lambda x: F.interpolate(x, size=3, mode=mode), _r(0, 2, 4))


# A scale whose size comes out unchanged along a dim (5 at 1.1 -> 5), or exactly doubled at
# a scale other than 2: torch's CPU kernels each treat such a dim their own way, forward and
# backward apart (registry/xla/upsample.py, _copies_same_size); 44 of 396 such calls
# differed from CPU before that table, forward or gradient
@pytest.mark.parametrize("op,scales,ac", [
    ("upsample_linear1d", [1.1], False), ("upsample_bilinear2d", [2.0, 1.1], False),
    ("upsample_trilinear3d", [1.2, 2.0, 1.1], False), ("upsample_bicubic2d", [1.1, 1.1], False),
    ("upsample_bicubic2d", [2.1, 1.1], False), ("_upsample_bilinear2d_aa", [2.0, 1.1], False),
    ("_upsample_bicubic2d_aa", [1.1, 0.5], False), ("upsample_nearest1d", [2.1], None),
    ("upsample_nearest2d", [2.1, 1.1], None), ("upsample_nearest3d", [1.2, 2.0, 1.1], None)])
def test_upsample_scales_that_keep_a_size(op, scales, ac):
    x = _r(*(1, 2, 5, 4, 6)[:2 + len(scales)], grad=True)
    args = (None, list(scales)) if ac is None else (None, ac, list(scales))
    check(lambda t: getattr(aten, op).vec(t, *args), x, grad=True)


def test_upsample_antialias_keeps_nan_and_inf_in_their_windows():
    # taps past an output's window read a clipped position with weight 0: adding 0 * inf made
    # every output padding onto it nan (bilinear 8x8 -> 3x3: 9 nan; CPU: 4 nan, 3 inf)
    x = _r(1, 1, 8, 8)
    x[0, 0, 1, 1], x[0, 0, 6, 5] = float("inf"), float("nan")
    for mode in ("bilinear", "bicubic"):
        for size in ((3, 3), (5, 6), (12, 12)):
            check(lambda t: F.interpolate(t, size=size, mode=mode, antialias=True), x)


def test_upsample_backward_ops_direct():
    g = _r(2, 3, 8, 10)
    check(lambda g: aten.upsample_bilinear2d_backward(g, [8, 10], [2, 3, 4, 5], True, None, None), g)
    check(lambda g: aten.upsample_nearest2d_backward(g, [8, 10], [2, 3, 3, 4], 2.5, 2.5), g)
    check(lambda g: aten.upsample_bicubic2d_backward(g, [8, 10], [2, 3, 4, 5], False, None, None), g)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sampler_2d(mode):
    # bicubic's grid gradient sums 16 taps whose rounding differs by summation order from
    # torch's kernel (both ~1e-5 from float64 at magnitude 50): its gradients run in float64
    dtype = torch.float64 if mode == "bicubic" else torch.float32
    x = _r(2, 3, 5, 7, dtype=dtype, grad=True)
    grid = torch.rand(2, 4, 6, 2, generator=torch.Generator().manual_seed(3)) * 2.6 - 1.3
    grid = grid.to(dtype).requires_grad_()
    for padding_mode, ac in (("zeros", False), ("border", True), ("reflection", False), ("reflection", True)):
        check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=ac),
              x, grid, grad=mode != "nearest", msg=f"{mode} {padding_mode} {ac}")
    if mode == "bicubic":
        check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode="border", align_corners=False), x.detach().float(),
              grid.detach().float())


def test_grid_sampler_3d():
    x = _r(1, 2, 3, 4, 5, grad=True)
    grid = (torch.rand(1, 2, 3, 4, 3, generator=torch.Generator().manual_seed(4)) * 2.4 - 1.2).requires_grad_()
    for mode in ("bilinear", "nearest"):
        for padding_mode in ("zeros", "border", "reflection"):
            check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=True),
                  x, grid, grad=mode != "nearest", msg=f"{mode} {padding_mode}")


def test_grid_sampler_bad_grid_raises_cpus_error():
    """torch's meta function for grid_sampler_2d is a decomposition that asserts
    (AssertionError); CPU's kernel raises RuntimeError with its own message."""
    x, grid = torch.randn(1, 1, 3, 3), torch.rand(1, 2, 2, 3)
    with pytest.raises(RuntimeError) as cpu:
        F.grid_sample(x, grid, align_corners=False)
    with pytest.raises(RuntimeError) as tpu:
        F.grid_sample(x.to("tpu"), grid.to("tpu"), align_corners=False)
    assert str(tpu.value) == str(cpu.value)


@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("padding_mode", ["border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sampler_gradient_on_the_borders(align_corners, padding_mode, nd):
    """An identity ``affine_grid`` (a spatial transformer at rest) puts points exactly on
    the border pixels, which torch's clamp counts as out of bounds: their grid gradient is
    zero, where a plain clamp's would be half."""
    size = (1, 2) + (4,) * nd
    grid = F.affine_grid(torch.eye(nd, nd + 1)[None], size, align_corners=align_corners)
    grid = torch.cat([grid, grid * 1.1 + 0.05], dim=1).requires_grad_()
    check(lambda x, g: F.grid_sample(x, g, padding_mode=padding_mode, align_corners=align_corners),
          _r(*size, grad=True), grid, grad=True)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_pad(mode):
    check(lambda x: F.pad(x, (2, 3), mode=mode), _r(2, 3, 5, grad=True), grad=True)
    check(lambda x: F.pad(x, (2, 3, 1, 0), mode=mode), _r(2, 3, 5, 4, grad=True), grad=True)
    check(lambda x: F.pad(x, (2, 1, 1, 0, 1, 2), mode=mode), _r(1, 2, 3, 5, 4, grad=True), grad=True)
    check(lambda x: F.pad(x, (-1, 2, 1, -1), mode=mode), _r(3, 5, 4, grad=True), grad=True)
    check(lambda x: F.pad(x, (1, 2), mode=mode), _r(4, 2, 5, dtype=torch.bfloat16).transpose(0, 1))
