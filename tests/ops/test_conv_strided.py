"""Strided 1-d convolutions lower to stride-1 ones (``registry/xla/conv_strided.py``):
XLA:TPU computes chains of strided 1-d convolutions wrongly (HuBERT's feature extractor
compiled on a v5e was 16% off), so neither the forward nor the backward program of one may
hold a window stride or a dilation; the rewrite is exact against XLA's strided one. And a
convolution whose output is longer than its input (padding past half the kernel; stride-1
and strided transposed ones) reads its input through an optimization barrier: XLA:TPU
computes its weight gradient wrongly otherwise (2-d ConvTranspose2d k4 s2 p1 included)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from tpu_kernels.registry.xla.conv import conv_nd, transposed_weight
from tpu_kernels.registry.xla.conv_strided import unit_stride_conv, unit_stride_conv_transpose

_WINDOW = re.compile(r"stride = \[([\d, ]+)\].*lhs_dilate = \[([\d, ]+)\], rhs_dilate = \[([\d, ]+)\]")


def _lowered(x_shape, w_shape, stride, padding, transposed=False) -> str:
    """The forward-and-backward program of ``conv_nd`` as the registry lowers torch's
    convolution (float32), as text."""
    nd = len(x_shape) - 2

    def step(x, w):
        y, vjp = jax.vjp(lambda x, w: conv_nd(x, w, stride, padding, (1,) * nd, transposed,
                                              (0,) * nd, 1), x, w)
        return y, vjp(jnp.ones_like(y))
    spec = [jax.ShapeDtypeStruct(s, jnp.float32) for s in (x_shape, w_shape)]
    return jax.jit(step).lower(*spec).as_text()


def _windows(x_shape, w_shape, stride, padding, transposed=False):
    """(stride, lhs_dilate, rhs_dilate) of every convolution in ``_lowered``'s program."""
    text = _lowered(x_shape, w_shape, stride, padding, transposed)
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


def test_transposed_1d_convolutions_lower_to_unit_windows():
    """An upsampler's ConvTranspose1d (weight (C_in, C_out, k)): no input dilation."""
    assert _windows((2, 16, 50), (16, 8, 10), (5,), (2,), transposed=True) == {(1,)}


def _barriers(x_shape, w_shape, stride, padding, transposed=False) -> int:
    """How many optimization barriers ``_lowered``'s program holds."""
    return _lowered(x_shape, w_shape, stride, padding, transposed).count("optimization_barrier")


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, transposed", [
    ((2, 8, 50), (8, 8, 4), (1,), (3,), False),            # causal conv (padding k-1)
    ((2, 8, 50), (8, 8, 3), (1,), (0,), True),             # ConvTranspose1d stride 1
    ((2, 16, 50), (16, 8, 10), (5,), (2,), True),          # the phase convolution's padding t-1
    ((2, 8, 9, 9), (8, 4, 4, 4), (2, 2), (1, 1), True),    # ConvTranspose2d k4 s2 p1 (UNet, VAE)
    ((2, 8, 9, 9), (8, 8, 3, 3), (1, 1), (2, 2), False),
])
def test_growing_convolutions_read_their_input_through_a_barrier(x_shape, w_shape, stride,
                                                                  padding, transposed):
    assert _barriers(x_shape, w_shape, stride, padding, transposed) >= 1


@pytest.mark.parametrize("x_shape, w_shape, stride, padding", [
    ((2, 8, 50), (8, 8, 3), (1,), (1,)), ((2, 8, 9, 9), (8, 8, 3, 3), (2, 2), (1, 1)),
    ((2, 8, 50), (8, 8, 5), (2,), (2,)),
])
def test_other_convolutions_have_no_barrier(x_shape, w_shape, stride, padding):
    """"Same" and shrinking convolutions keep XLA's fusion of their input's producer."""
    assert _barriers(x_shape, w_shape, stride, padding) == 0


def test_strided_2d_convolutions_stay_strided():
    """Left to XLA (no wrong result seen; the rewrite would cost 3-4x there)."""
    assert (2, 2) in _windows((2, 3, 16, 16), (4, 3, 3, 3), (2, 2), (1, 1))


def test_convolutions_of_stride_4_lower_to_unit_windows():
    """XLA's dilated form of ``nn.ConvTranspose2d(32, 32, 5, stride=4)`` on 20x20, and of
    ``nn.Conv2d(32, 32, 5, stride=4)``'s input gradient on 81x81, abort XLA:TPU's compiler
    (``aborts_on_tpu``; ``tests/aot/test_compiler_aborts.py``); stride 2 stays XLA's."""
    assert _windows((2, 32, 20, 20), (32, 32, 5, 5), (4, 4), (0, 0), transposed=True) == {(1, 1)}
    assert _windows((2, 32, 81, 81), (32, 32, 5, 5), (4, 4), (0, 0)) == {(1, 1)}
    assert (2, 2) in _windows((2, 8, 9, 9), (8, 4, 4, 4), (2, 2), (1, 1), transposed=True)


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


TRANSPOSED = [  # (size, kernel, stride, padding, output_padding, groups), per spatial dim
    ((50,), (10,), (5,), (2,), (0,), 1), ((7,), (3,), (2,), (1,), (1,), 1),
    ((9,), (2,), (4,), (0,), (3,), 2), ((6,), (8,), (3,), (3,), (2,), 1), ((5,), (4,), (4,), (0,), (0,), 2),
    # 2-d, the shapes ``aborts_on_tpu`` sends here (stride >= 4)
    ((20, 20), (5, 5), (4, 4), (0, 0), (0, 0), 1), ((6, 7), (8, 3), (4, 5), (2, 1), (1, 3), 1),
]


@pytest.mark.parametrize("size, kernel, stride, padding, output_padding, groups", TRANSPOSED)
def test_unit_stride_conv_transpose_matches_the_dilated_one(size, kernel, stride, padding,
                                                            output_padding, groups):
    """Against XLA's form (the input dilated by the stride, the kernel flipped), forward and
    gradients."""
    rng = np.random.default_rng(sum(size) + sum(kernel))
    x = rng.standard_normal((2, 2 * groups) + size).astype(np.float32)
    w = rng.standard_normal((2 * groups, 3) + kernel).astype(np.float32)
    prec = lax.Precision.HIGHEST
    pads = [(k - 1 - p, k - 1 - p + op) for k, p, op in zip(kernel, padding, output_padding)]

    def dilated(x, w):
        return lax.conv_general_dilated(x, transposed_weight(w, groups), (1,) * len(size), pads,
                                        lhs_dilation=stride, feature_group_count=groups,
                                        precision=prec)

    def phases(x, w):
        return unit_stride_conv_transpose(x, w, stride, padding, output_padding, groups, precision=prec)

    for f in (lambda c: c, lambda c: jax.grad(lambda x, w: (jnp.tanh(c(x, w)) ** 2).sum(), (0, 1))):
        want, got = jax.jit(f(dilated))(x, w), jax.jit(f(phases))(x, w)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))
