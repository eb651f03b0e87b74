"""``tpu_kernels.strided``: reading and writing any strided view of a storage equals numpy's
``as_strided`` on the flat buffer, whatever the storage's own shape (a result laid out in
memory order keeps its dims; views are then cut from it reshaped to their stride grid)."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
import torch
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


# -- torch's memory-overlap checks of written tensors (tpu_kernels/dispatch/overlap.py) ----------


def _expanded(d):
    return torch.zeros(3, 1, device=d).expand(3, 4)


def _square(d):
    return torch.arange(9.0, device=d).reshape(3, 3)


_OVERLAPS = [   # (make the written tensor, write): CPU's answer is the spec
    (_expanded, lambda x: x.add_(1)),                            # refused: internal overlap
    (_expanded, lambda x: x.copy_(torch.arange(12.0, device=x.device).reshape(3, 4))),
    (_expanded, lambda x: x.uniform_()),
    (_expanded, lambda x: x.index_add_(1, torch.tensor([0], device=x.device), torch.ones(3, 1, device=x.device))),
    (_expanded, lambda x: torch.add(torch.ones(3, 4, device=x.device), 1, out=x)),
    (lambda d: torch.zeros(3, 1, 0, device=d).expand(3, 2, 0), lambda x: x.add_(1)),   # empty
    (_expanded, lambda x: x.fill_(1)),                           # allowed
    (_expanded, lambda x: x.zero_()),
    (_expanded, lambda x: x.masked_fill_(torch.ones(3, 4, dtype=torch.bool, device=x.device), 1.0)),
    (_square, lambda x: x.add_(x.t())),                          # refused: partial overlap
    (_square, lambda x: x.add_(x[0])),
    (_square, lambda x: x[1:].copy_(x[:2])),
    (_square, lambda x: x.mul_(x[0, 0])),
    (_square, lambda x: x.__setitem__(slice(1, 3), x[0:2])),
    (_square, lambda x: torch.cat([x[:1], x[:2]], out=x)),
    (_square, lambda x: torch.exp(x.view(9)[:4], out=x.view(9)[2:6])),
    (_square, lambda x: x.add_(x)),                              # allowed: full or no overlap
    (_square, lambda x: x.copy_(x[:])),
    (_square, lambda x: x.view(9)[3:6].add_(x[0])),
    (_square, lambda x: torch.exp(x[0], out=x[1])),
    (_square, lambda x: x.masked_fill_(x > 2, x[0, 1])),
]


@pytest.mark.parametrize("make, write", _OVERLAPS)
def test_writes_through_overlapping_memory_raise_as_on_cpu(make, write):
    """torch refuses a write where two elements of the written tensor share memory, or an
    input partly overlaps it (the result would depend on the kernel's order); tpu computed
    some answer. What torch allows still runs, with CPU's values."""
    def run(d):
        x = make(d)
        try:
            write(x)
        except RuntimeError as exc:
            return str(exc)
        return x.cpu()
    got, want = run("tpu"), run("cpu")
    if isinstance(want, str):
        assert got == want
    else:
        assert isinstance(got, torch.Tensor), got
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("make, write", [
    (_expanded, lambda x: torch.sum(torch.ones(3, 4, 5, device=x.device), 2, out=x)),
    (_square, lambda x: x.sub_(x.diagonal())),          # not dense: "too hard", let through
    (_square, lambda x: x.addmm_(x.t(), torch.ones(3, 3, device=x.device))),
])
def test_overlapping_writes_torch_lets_through_run(make, write):
    """Writes torch does not check (its result then depends on its kernel's order: only
    that they run is compared)."""
    write(make("cpu"))
    write(make("tpu"))


@pytest.mark.parametrize("view", ["t", "contiguous", "step", "channels_last", "expand", "t_unsqueeze"])
@pytest.mark.parametrize("kwargs", [{}, {"dtype": torch.float64}, {"memory_format": torch.contiguous_format}])
def test_cpu_copy_keeps_a_dense_layout(view, kwargs):
    """``x.t().cpu()`` keeps the transposed strides as a copy from CUDA does (torch's
    ``_to_copy`` under preserve_format: a dense tensor's strides, else contiguous); it
    came back contiguous."""
    views = {"t": lambda t: t.t(), "contiguous": lambda t: t, "step": lambda t: t[:, ::2],
             "channels_last": lambda t: t.reshape(1, 2, 3, 1).contiguous(memory_format=torch.channels_last),
             "expand": lambda t: t.expand(2, 2, 3), "t_unsqueeze": lambda t: t.t().unsqueeze(1)}
    x = torch.randn(2, 3)
    src = views[view](x)
    got = views[view](x.to("tpu")).to("cpu", **kwargs)
    want = torch.empty_like(src, dtype=kwargs.get("dtype"), memory_format=kwargs.get("memory_format", torch.preserve_format))
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, src.to(got.dtype))
