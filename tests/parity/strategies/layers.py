"""Padding, upsampling, grid sampling, attention, distances, FFT, prelu, grouped_mm, glu."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from hypothesis import strategies as st


from strategies.base import (BF16, BOOL, Case, F32, FLOATS, I32, Spec, Unsupported, dtypes, shapes,
    tensors, valid_dim)
from strategies.losses import _GroupSizes

# -- padding, upsampling, sampling, attention, distances, FFT -------------------------------------
@st.composite
def padding(draw, op):
    name = str(op).split(".")[1]
    nd = 3 if "3d" in name else 2 if "2d" in name else 1
    dtype = draw(dtypes(FLOATS))
    lead = draw(st.sampled_from([(1,), (2,), (1, 2), (2, 3)]))
    size = [draw(st.sampled_from([1, 2, 4, 7] if nd < 3 else [2, 3])) for _ in range(nd)]
    x = draw(tensors(lead + tuple(size), dtype))
    pad = []
    for s in reversed(size):
        hi = s - 1 if name.startswith("reflection") else 4
        pad += [draw(st.integers(0, max(hi, 0))), draw(st.integers(0, max(hi, 0)))]
    return Case((x, pad))


@st.composite
def upsample(draw, op):
    full = str(op)
    name = full.split(".")[1]
    ov = full.split(".")[2]
    nd = 3 if "3d" in name else 2 if "2d" in name else 1
    dtype = draw(dtypes(FLOATS))
    size = [draw(st.sampled_from([1, 2, 3, 5, 8] if nd < 3 else [1, 2, 3])) for _ in range(nd)]
    x = draw(tensors((draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 3]))) + tuple(size), dtype))
    out = [draw(st.sampled_from([1, 2, 3, 4, 7, 9])) for _ in range(nd)]
    align = "nearest" not in name
    if ov == "vec":
        if draw(st.booleans()):
            args = (x, out, draw(st.booleans())) if align else (x, out)
            return Case(args + (None,))
        sf = [draw(st.sampled_from([0.5, 1.0, 2.0, 1.5])) for _ in range(nd)]
        return Case(((x, None, draw(st.booleans())) if align else (x, None)) + (sf,))
    if align:
        return Case((x, out, draw(st.booleans())))
    return Case((x, out))


@st.composite
def grid_sampler(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(FLOATS))
    nd = 3 if "3d" in name else 2
    n, c = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 3]))
    size = [draw(st.sampled_from([2, 4, 5])) for _ in range(nd)]
    out = [draw(st.sampled_from([1, 3, 4])) for _ in range(nd)]
    x = draw(tensors((n, c) + tuple(size), dtype, special=False))
    grid = draw(tensors((n,) + tuple(out) + (nd,), dtype, special=False, low=-1.2, high=1.2))
    mode = draw(st.sampled_from([0, 1] + ([2] if nd == 2 else [])))
    return Case((x, grid, mode, draw(st.sampled_from([0, 1, 2])), draw(st.booleans())))


@st.composite
def attention(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(FLOATS))
    b, h = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 4]))
    hk = draw(st.sampled_from([h, 1])) if "for_cpu" not in name else h
    lq, lk = draw(st.sampled_from([1, 7, 16])), draw(st.sampled_from([1, 7, 16]))
    d = draw(st.sampled_from([8, 16, 64]))
    # torch's CPU flash kernel assumes its inputs' layout (sdpa makes them so before calling
    # it): a transposed or stepped k/v changes its result, so the reference needs contiguous
    lay = {"layout": "contiguous"} if "for_cpu" in name else {}
    q = draw(tensors((b, h, lq, d), dtype, special=False, **lay))
    k = draw(tensors((b, hk, lk, d), dtype, special=False, **lay))
    v = draw(tensors((b, hk, lk, d), dtype, special=False, **lay))
    causal = draw(st.booleans())
    scale = draw(st.sampled_from([None, 0.3]))
    if name == "_scaled_dot_product_flash_attention_for_cpu":
        mask = None
        if not causal and draw(st.booleans()):
            mask = draw(tensors((lq, lk), draw(st.sampled_from([BOOL, dtype])), special=False))
        return Case((q, k, v, 0.0, causal), {"attn_mask": mask, "scale": scale})
    if name in ("_scaled_dot_product_flash_attention",):
        return Case((q, k, v, 0.0, causal), {"scale": scale})
    if name == "_scaled_dot_product_efficient_attention":
        return Case((q, k, v, None, draw(st.booleans()), 0.0, causal), {"scale": scale})
    if name == "_scaled_dot_product_fused_attention_overrideable":
        return Case((q, k, v, None, 0.0, causal), {"scale": scale})
    raise Unsupported(name)


@st.composite
def distance(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes((F32,)))
    d = draw(st.sampled_from([1, 3, 8]))
    m, n = draw(st.sampled_from([1, 4, 7])), draw(st.sampled_from([1, 5]))
    x1 = draw(tensors((m, d), dtype, special=False))
    x2 = draw(tensors((n, d), dtype, special=False))
    p = draw(st.sampled_from([2.0, 1.0, 0.0, 3.0, float("inf")]))
    if name == "_cdist_forward":
        return Case((x1, x2, p, draw(st.sampled_from([None, 1, 2]))))
    if name == "_pdist_forward":
        return Case((x1, p))
    if name == "_euclidean_dist":
        return Case((x1, x2))
    raise Unsupported(name)


@dataclasses.dataclass(frozen=True)
class _Complex:
    re: Spec
    im: Spec

    @property
    def dtype(self):
        return torch.complex64

    @property
    def shape(self):
        return self.re.shape

    def build(self, device="cpu"):
        t = torch.complex(self.re.build("cpu"), self.im.build("cpu"))
        return t if device == "cpu" else t.to(device)


@st.composite
def fft(draw, op):
    name = str(op).split(".")[1]
    shape = draw(shapes(min_dims=1, max_dims=3, min_side=1, cap=512))
    nd = len(shape)
    dims = sorted(draw(st.lists(st.integers(0, nd - 1), unique=True, min_size=1, max_size=nd)))
    norm_ = draw(st.sampled_from([0, 1, 2]))
    re = draw(tensors(shape, F32, special=False, layout="contiguous"))
    if name == "_fft_r2c":
        return Case((re, dims, norm_, draw(st.booleans())), grad=False)
    z = _Complex(re, draw(tensors(shape, F32, special=False, layout="contiguous")))
    if name == "_fft_c2c":
        return Case((z, dims, norm_, draw(st.booleans())), grad=False)
    if name == "_fft_c2r":
        last = draw(st.sampled_from([2 * (shape[dims[-1]] - 1), 2 * shape[dims[-1]] - 1]))
        return Case((z, dims, norm_, max(last, 1)), grad=False)
    raise Unsupported(name)


@st.composite
def prelu(draw, op):
    dtype = draw(dtypes(FLOATS))
    shape = draw(shapes(min_dims=1))
    c = shape[1] if len(shape) > 1 else 1
    w = draw(tensors((draw(st.sampled_from([1, c])),), dtype))
    return Case((draw(tensors(shape, dtype)), w))


@st.composite
def grouped_mm(draw, op):
    dtype = draw(dtypes((BF16, F32)))
    g = draw(st.sampled_from([1, 2, 4]))
    m, k, n = draw(st.sampled_from([8, 16])), draw(st.sampled_from([8, 16])), draw(st.sampled_from([8, 16]))
    offs = _Offsets(_GroupSizes(m, g, draw(st.integers(0, 2 ** 16))))
    return Case((draw(tensors((m, k), dtype, special=False)), draw(tensors((g, k, n), dtype, special=False)), offs))


@dataclasses.dataclass(frozen=True)
class _Offsets:
    sizes: Any
    dtype = I32

    @property
    def shape(self):
        return self.sizes.shape

    def build(self, device="cpu"):
        t = self.sizes.build("cpu").cumsum(0).to(torch.int32)
        return t if device == "cpu" else t.to(device)


@st.composite
def glu(draw, op):
    dtype = draw(dtypes(FLOATS))
    shape = list(draw(shapes(min_dims=1)))
    dim = draw(valid_dim(len(shape)))
    shape[dim] = 2 * max(1, shape[dim] // 2)
    return Case((draw(tensors(tuple(shape), dtype)), dim))
