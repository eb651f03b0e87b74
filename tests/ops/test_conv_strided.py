"""Strided 1-d convolutions lower to stride-1 ones (``registry/xla/conv_strided.py``):
XLA:TPU computes chains of strided 1-d convolutions wrongly (HuBERT's feature extractor
compiled on a v5e was 16% off), so neither the forward nor the backward program of one may
hold a window stride or a dilation; the rewrite is exact against XLA's strided one."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from tpu_kernels.registry.xla.conv import conv_nd
from tpu_kernels.registry.xla.conv_strided import unit_stride_conv

_WINDOW = re.compile(r"stride = \[([\d, ]+)\].*lhs_dilate = \[([\d, ]+)\], rhs_dilate = \[([\d, ]+)\]")


def _windows(x_shape, w_shape, stride, padding):
    """(stride, lhs_dilate, rhs_dilate) of every convolution in the forward-and-backward
    program of ``conv_nd`` as the registry lowers torch's convolution."""
    nd = len(x_shape) - 2

    def step(x, w):
        y, vjp = jax.vjp(lambda x, w: conv_nd(x, w, stride, padding, (1,) * nd, False, (0,) * nd, 1), x, w)
        return y, vjp(jnp.ones_like(y))
    spec = [jax.ShapeDtypeStruct(s, jnp.float32) for s in (x_shape, w_shape)]
    text = jax.jit(step).lower(*spec).as_text()
    found = [m.groups() for m in map(_WINDOW.search, text.splitlines()) if m and "convolution" in m.string]
    assert len(found) == 3, text    # forward, input gradient, weight gradient
    return {tuple(int(v) for v in g.split(",")) for group in found for g in group}


@pytest.mark.parametrize("x_shape, w_shape, stride, padding", [
    ((2, 1, 400), (16, 1, 8), (4,), (0,)),          # HuBERT's first layer
    ((2, 16, 99), (16, 16, 4), (2,), (1,)),
    ((2, 3, 1, 50), (4, 3, 1, 5), (1, 3), (0, 2)),  # a 1-d convolution written as 2-d
])
def test_strided_1d_convolutions_lower_to_unit_windows(x_shape, w_shape, stride, padding):
    assert _windows(x_shape, w_shape, stride, padding) == {(1,) * len(stride)}


def test_strided_2d_convolutions_stay_strided():
    """Left to XLA (no wrong result seen; the rewrite would cost 3-4x there)."""
    assert (2, 2) in _windows((2, 3, 16, 16), (4, 3, 3, 3), (2, 2), (1, 1))


CASES = [  # (spatial, kernel, stride, padding, groups): kernels longer and shorter than strides
    ((400,), (8,), (4,), (0,), 1), ((99,), (4,), (2,), (1,), 1), ((17,), (1,), (2,), (0,), 1),
    ((23,), (3,), (5,), (2,), 2), ((5,), (5,), (3,), (1,), 1), ((9, 11), (3, 2), (2, 3), (1, 0), 1),
    ((7, 6, 5), (2, 3, 1), (2, 1, 3), (0, 1, 1), 2), ((30,), (10,), (5,), (4,), 3),
]


@pytest.mark.parametrize("spatial, kernel, stride, padding, groups", CASES)
def test_unit_stride_conv_matches_the_strided_one(spatial, kernel, stride, padding, groups):
    rng = np.random.default_rng(sum(spatial) + sum(kernel))
    x = rng.standard_normal((2, 2 * groups) + spatial).astype(np.float32)
    w = rng.standard_normal((3 * groups, 2) + kernel).astype(np.float32)
    prec = lax.Precision.HIGHEST

    def strided(x, w):
        return lax.conv_general_dilated(x, w, stride, [(p, p) for p in padding],
                                        feature_group_count=groups, precision=prec)

    def rewritten(x, w):
        return unit_stride_conv(x, w, stride, padding, groups, precision=prec)

    for f in (lambda c: c, lambda c: jax.grad(lambda x, w: (c(x, w) ** 2).sum(), (0, 1))):
        want, got = jax.jit(f(strided))(x, w), jax.jit(f(rewritten))(x, w)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))
