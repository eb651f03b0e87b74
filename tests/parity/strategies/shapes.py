"""Shape and view ops."""
from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st


from strategies.base import (ALL, Case, I64, Unsupported, broadcast_to, dtypes, max_numel, numel,
    scalar_for, shapes, tensors, valid_dim)

# -- shapes and views ---------------------------------------------------------------------------------
_SHAPE_BASES = {"view", "permute", "transpose", "t", "squeeze", "unsqueeze", "expand", "select", "slice",
                "narrow", "split", "split_with_sizes", "unbind", "diagonal", "alias", "unfold", "as_strided",
                "detach", "lift_fresh"}


@st.composite
def shape_op(draw, op):
    full = str(op)
    name = full.split(".")[1]
    base = name[:-5] if name.endswith("_copy") and name[:-5] in _SHAPE_BASES else name
    ov = full.split(".")[2]
    dtype = draw(dtypes(ALL))
    shape = draw(shapes())
    nd = len(shape)
    x = draw(tensors(shape, dtype))

    def dims_perm():
        return list(draw(st.permutations(range(nd))))
    if base in ("view", "_unsafe_view", "reshape"):
        new = list(shape)
        if x.layout != "contiguous" and base != "reshape":
            x = dataclasses.replace(x, layout="contiguous")
        choice = draw(st.integers(0, 3))
        if choice == 0:
            new = [numel(shape)]
        elif choice == 1 and nd:
            new = [-1] + list(shape[1:]) if shape[0] else list(shape)
        elif choice == 2:
            new = list(shape) + [1]
        return Case((x, new), grad=True)
    if base in ("permute",):
        return Case((x, dims_perm()))
    if base in ("transpose",):
        return Case((x, draw(valid_dim(nd)), draw(valid_dim(nd))))
    if base == "t":
        x = draw(tensors(draw(shapes(max_dims=2)), dtype))
        return Case((x,))
    if base in ("squeeze",):
        if ov == "dim":
            return Case((x, draw(valid_dim(nd))))
        if ov == "dims":
            return Case((x, draw(st.lists(st.integers(0, max(nd - 1, 0)), unique=True, max_size=nd))))
        return Case((x,))
    if base == "unsqueeze":
        return Case((x, draw(st.integers(-nd - 1, nd))))
    if base == "expand":
        new = [s if s != 1 or not draw(st.booleans()) else draw(st.sampled_from([1, 3])) for s in shape]
        new = ([2] if draw(st.booleans()) else []) + new
        if draw(st.booleans()) and new:
            new[-1] = -1
        return Case((x, new))
    if base in ("select", "select_scatter"):
        if nd == 0 or 0 in shape:
            raise_reject(draw)
        d = draw(valid_dim(nd))
        i = draw(st.integers(-shape[d], shape[d] - 1))
        if base == "select":
            return Case((x, d, i))
        src = draw(tensors(shape[:d % nd] + shape[d % nd + 1:], dtype))
        return Case((x, src, d, i))
    if base in ("slice", "slice_scatter", "narrow"):
        if nd == 0:
            raise_reject(draw)
        d = draw(valid_dim(nd))
        s = shape[d]
        start = draw(st.integers(-s - 1, s + 1))
        end = draw(st.integers(-s - 1, s + 2))
        step = draw(st.sampled_from([1, 1, 2, 3]))
        if base == "narrow":
            start = draw(st.integers(0, s))
            return Case((x, d, start, draw(st.integers(0, s - start))))
        if base == "slice":
            return Case((x, d, start, end, step))
        res = torch.empty(shape, device="meta").slice(d, start, end, step) if hasattr(torch.Tensor, "slice") else None
        sl = [slice(None)] * nd
        sl[d % nd] = slice(start, end, step)
        res = torch.empty(shape, device="meta")[tuple(sl)]
        return Case((x, draw(tensors(tuple(res.shape), dtype)), d, start, end, step))
    if base.startswith("unsafe_split"):
        base = base[len("unsafe_"):]
    if base in ("split", "split_with_sizes", "chunk", "unbind"):
        if nd == 0:
            raise_reject(draw)
        d = draw(valid_dim(nd))
        if base == "unbind":
            return Case((x, d))
        if base == "split":
            return Case((x, draw(st.integers(1, max(shape[d], 1) + 1)), d))
        if base == "chunk":
            return Case((x, draw(st.integers(1, 4)), d))
        sizes = []
        left = shape[d]
        while left > 0:
            k = draw(st.integers(1, left))
            sizes.append(k)
            left -= k
        return Case((x, sizes, d))
    if base in ("cat", "stack", "_chunk_cat"):
        k = draw(st.integers(1, 3))
        if base == "stack":
            parts = [draw(tensors(shape, dtype)) for _ in range(k)]
            return Case((parts, draw(st.integers(-nd - 1, nd))))
        if nd == 0:
            shape, nd = (3,), 1
        d = draw(valid_dim(nd))
        parts = []
        for _ in range(k):
            s = list(shape)
            s[d] = draw(st.sampled_from([0, 1, 2, 5]))
            parts.append(draw(tensors(s, dtype)))
        if base == "_chunk_cat":
            return Case((parts, d % nd, draw(st.integers(1, 3))))
        return Case((parts, d))
    if base == "flip":
        return Case((x, draw(st.lists(st.integers(0, max(nd - 1, 0)), unique=True, max_size=nd))))
    if base == "roll":
        k = draw(st.integers(1, max(nd, 1)))
        if nd == 0:
            return Case((x, [draw(st.integers(-3, 3))]))
        dims = draw(st.lists(st.integers(0, nd - 1), unique=True, min_size=k, max_size=k))
        return Case((x, [draw(st.integers(-9, 9)) for _ in dims], dims))
    if base == "repeat":
        reps = [draw(st.sampled_from([0, 1, 2, 3])) for _ in range(nd + draw(st.integers(0, 1)))]
        if numel(shape) * numel(reps) > max_numel():
            reps = [1] * len(reps)
        return Case((x, reps))
    if base == "constant_pad_nd":
        k = draw(st.integers(0, nd))
        pad = [draw(st.integers(-1, 3)) for _ in range(2 * k)]
        return Case((x, pad, draw(scalar_for(dtype))))
    if base in ("tril", "triu"):
        x = draw(tensors(draw(shapes(min_dims=2)), dtype))
        return Case((x, draw(st.integers(-3, 3))))
    if base in ("diagonal", "diag_embed", "diagonal_scatter"):
        if nd < 2 and base != "diag_embed":
            raise_reject(draw)
        off = draw(st.integers(-2, 2))
        if base == "diag_embed":
            n = nd + 1
            if n < 2:
                raise_reject(draw)
            d1, d2 = draw(st.lists(st.integers(0, n - 1), unique=True, min_size=2, max_size=2))
            return Case((x, off, d1, d2))
        d1, d2 = draw(st.lists(st.integers(0, nd - 1), unique=True, min_size=2, max_size=2))
        if base == "diagonal":
            return Case((x, off, d1, d2))
        diag = torch.empty(shape, device="meta").diagonal(off, d1, d2)
        return Case((x, draw(tensors(tuple(diag.shape), dtype)), off, d1, d2))
    if base in ("alias", "detach", "clone", "lift_fresh", "lift_fresh_copy", "t", "squeeze"):
        return Case((x,))
    if base == "_to_copy":
        return Case((x,), {"dtype": draw(st.sampled_from(list(ALL)))})
    if base in ("copy", "copy_"):
        src = draw(tensors(draw(broadcast_to(shape)), draw(dtypes(ALL))))
        return Case((x, src))
    if base == "unfold":
        if nd == 0:
            raise_reject(draw)
        d = draw(valid_dim(nd))
        size = draw(st.integers(0 if shape[d] else 0, shape[d]))
        if size == 0 and draw(st.booleans()):
            size = min(1, shape[d])
        return Case((x, d, size, draw(st.integers(1, 3))))
    if base == "as_strided":
        x = dataclasses.replace(x, layout="contiguous")
        n = numel(shape)
        if n == 0:
            return Case((x, [0], [1], 0))
        size = [draw(st.integers(1, max(1, n // 2))) for _ in range(draw(st.integers(1, 2)))]
        stride = [draw(st.integers(0, 2)) for _ in size]
        span = sum((s - 1) * t for s, t in zip(size, stride))
        if span >= n:
            stride = [0] * len(size)
            span = 0
        off = draw(st.integers(0, n - 1 - span))
        return Case((x, size, stride, off))
    if base == "as_strided_scatter":
        n = numel(shape)
        if n == 0:
            raise_reject(draw)
        x = dataclasses.replace(x, layout="contiguous")
        size = [draw(st.integers(1, max(1, n // 2)))]
        stride = [draw(st.integers(1, 2))]
        if (size[0] - 1) * stride[0] >= n:
            stride = [1]
            size = [min(size[0], n)]
        off = draw(st.integers(0, n - 1 - (size[0] - 1) * stride[0]))
        return Case((x, draw(tensors(tuple(size), dtype)), size, stride, off))
    if base in ("pixel_shuffle", "pixel_unshuffle"):
        r = draw(st.sampled_from([1, 2, 3]))
        c = draw(st.sampled_from([1, 2]))
        hw = draw(st.sampled_from([1, 2, 3]))
        if base == "pixel_shuffle":
            return Case((draw(tensors((2, c * r * r, hw, hw), dtype)), r))
        return Case((draw(tensors((2, c, hw * r, hw * r), dtype)), r))
    if base in ("channel_shuffle", "native_channel_shuffle"):
        g = draw(st.sampled_from([1, 2, 3]))
        return Case((draw(tensors((2, g * draw(st.sampled_from([1, 2])), 3), dtype)), g))
    if base == "block_diag":
        parts = [draw(tensors(draw(shapes(max_dims=2, cap=64)), dtype)) for _ in range(draw(st.integers(1, 3)))]
        return Case((parts,))
    if base == "rot90":
        if nd < 2:
            raise_reject(draw)
        dims = draw(st.lists(st.integers(0, nd - 1), unique=True, min_size=2, max_size=2))
        return Case((x, draw(st.integers(-4, 4)), dims))
    if base == "repeat_interleave":
        reps = draw(tensors((draw(st.integers(0, 9)),), I64, values="int", low=0, high=4))
        return Case((reps,), grad=False)
    if base == "movedim":
        return Case((x, draw(valid_dim(nd)), draw(valid_dim(nd))))
    raise Unsupported(full)


def raise_reject(draw):
    from hypothesis import reject
    reject()
