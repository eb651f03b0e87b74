"""``tpu_kernels.strided``: reading and writing any strided view of a storage equals numpy's
``as_strided`` on the flat buffer, whatever the storage's own shape (a result laid out in
memory order keeps its dims; views are then cut from it reshaped to their stride grid)."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_kernels import strided


@st.composite
def views(draw):
    """(storage shape, view size, strides, offset) with every element inside the storage."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    numel = math.prod(shape)
    size = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    stride = tuple(draw(st.sampled_from([0, 1, 2, 3, 4, 6, 8, 12, 16, 24])) for _ in size)
    span = sum((n - 1) * s for n, s in zip(size, stride))
    if span >= numel:
        stride = (0,) * len(size)
        span = 0
    offset = draw(st.integers(0, numel - 1 - span))
    return shape, size, stride, offset


def _expected(flat: np.ndarray, size, stride, offset) -> np.ndarray:
    """The view as numpy cuts it (writable: ``flat`` is then written through it)."""
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat[offset:], size, [s * item for s in stride],
                                           writeable=True)


@settings(max_examples=60)
@given(views())
def test_reading_a_view_equals_as_strided(view):
    shape, size, stride, offset = view
    flat = np.arange(math.prod(shape), dtype=np.float32)
    got = strided.reader(flat.size, size, stride, offset)(jnp.asarray(flat.reshape(shape)))
    np.testing.assert_array_equal(np.asarray(got), _expected(flat, size, stride, offset))


@settings(max_examples=60)
@given(views())
def test_writing_a_view_equals_as_strided(view):
    shape, size, stride, offset = view
    # overlapping or expanded views have no defined write order: writable views only
    if any(s == 0 and n > 1 for n, s in zip(size, stride)) or \
            strided.plan(math.prod(shape), size, stride, offset).kind != "window":
        return
    flat = np.arange(math.prod(shape), dtype=np.float32)
    value = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    want = flat.copy()
    _expected(want, size, stride, offset)[...] = value
    got = strided.writer(shape, size, stride, offset)(jnp.asarray(flat.reshape(shape)),
                                                      jnp.asarray(value))
    assert got.shape == shape
    np.testing.assert_array_equal(np.asarray(got).reshape(-1), want)


def test_a_transposed_view_is_cut_from_the_storage_grid_not_its_flat_array():
    # [b, h, s, d] over a [b, s, h, d] storage: the storage reshaped to [b, s, h, d, 1]
    p = strided.plan(2 * 3 * 4 * 8, (2, 4, 3, 8), (96, 8, 32, 1), 0)
    assert strided._box(2 * 3 * 4 * 8, p)[0] == (2, 3, 4, 8, 1)
    # a window that wraps around a grid row is cut from the flat array
    p = strided.plan(12, (2, 3), (4, 1), 2)      # rows of 4: elements 2-4 and 6-8
    assert p.kind == "window" and strided._box(12, p) is None
