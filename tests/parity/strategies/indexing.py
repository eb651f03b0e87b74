"""Indexing: gathers, scatters, index_put, masked ops, embedding."""
from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st


from strategies.base import (ALL, BOOL, Case, FLOATS, I32, I64, Unsupported, broadcast_to, dtypes, numel,
    scalar_for, shapes, tensors, valid_dim)

# -- indexing ---------------------------------------------------------------------------------------
@st.composite
def indexing(draw, op):
    name = str(op).split(".")[1]
    overload = str(op).split(".")[2]
    dtype = draw(dtypes(ALL))
    shape = draw(shapes(min_dims=1, min_side=1))
    nd = len(shape)
    x = draw(tensors(shape, dtype))
    dim = draw(valid_dim(nd))
    size = shape[dim]

    def index(ishape, hi, unique=False):
        return draw(tensors(ishape, draw(st.sampled_from([I64, I64, I32])) if not unique else I64,
                            values="unique_int" if unique else "int", low=-hi if not unique and
                            draw(st.booleans()) and name in ("index_select", "gather") and False else 0,
                            high=hi, layout="contiguous"))

    if name in ("gather", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
                "scatter_reduce_"):
        unique = name in ("scatter", "scatter_")
        if unique:
            dim = nd - 1
            size = shape[dim]
        ishape = tuple(draw(st.integers(0, s)) for s in shape)
        if unique:
            ishape = ishape[:-1] + (min(ishape[-1], size),)
            idx = draw(tensors(ishape, I64, values="distinct", layout="contiguous"))
            idx = dataclasses.replace(idx, values="distinct")
        else:
            idx = index(ishape, size)
        if name == "gather":
            return Case((x, dim, idx))
        if overload in ("value", "value_reduce"):
            val = draw(scalar_for(dtype))
            if overload == "value_reduce":
                return Case((x, dim, idx, val), {"reduce": draw(st.sampled_from(["add", "multiply"]))})
            return Case((x, dim, idx, val))
        src = draw(tensors(ishape, dtype))
        if name.startswith("scatter_reduce"):
            return Case((x, dim, idx, src, draw(st.sampled_from(["sum", "prod", "mean", "amax", "amin"]))),
                        {"include_self": draw(st.booleans())})
        if overload == "reduce":
            return Case((x, dim, idx, src), {"reduce": draw(st.sampled_from(["add", "multiply"]))})
        return Case((x, dim, idx, src))
    if name in ("index_select", "index_add", "index_add_", "index_copy", "index_copy_", "index_fill",
                "index_fill_", "index_reduce", "index_reduce_"):
        unique = name.startswith(("index_copy", "index_fill"))
        k = draw(st.integers(0, size if unique else 2 * size))
        idx = index((k,) if draw(st.integers(0, 4)) or k != 1 else (), size, unique)
        if nd == 0:
            dim = 0
        if name == "index_select":
            return Case((x, dim, idx))
        src_shape = tuple(numel(idx.shape) if i == dim % nd else s for i, s in enumerate(shape))
        src = draw(tensors(src_shape, dtype))
        if name.startswith("index_add"):
            return Case((x, dim, idx, src), {"alpha": draw(scalar_for(dtype, (1, 2, -1)))})
        if name.startswith("index_copy"):
            return Case((x, dim, idx, src))
        if name.startswith("index_fill"):
            if overload == "int_Tensor":
                return Case((x, dim, idx, draw(tensors((), dtype))))
            return Case((x, dim, idx, draw(scalar_for(dtype))))
        return Case((x, dim, idx, src, draw(st.sampled_from(["prod", "mean", "amax", "amin"]))),
                    {"include_self": draw(st.booleans())})
    if name in ("index", "_unsafe_index", "index_put", "index_put_", "_unsafe_index_put"):
        put = "put" in name
        accumulate = draw(st.booleans()) if put else False
        lead = draw(st.integers(0, nd - 1))
        nidx = 1 if (put and not accumulate) else draw(st.integers(1, nd - lead))
        ishape = draw(shapes(max_dims=2, cap=64))
        if put and not accumulate:
            ishape = (draw(st.integers(0, shape[lead])),)
        if draw(st.integers(0, 5)) == 0 and not put and nidx == 1:   # boolean mask
            idxs = [draw(tensors(shape[lead:lead + 1], BOOL))]
        else:
            idxs = [index(ishape, shape[lead + i], unique=put and not accumulate) for i in range(nidx)]
        indices = [None] * lead + idxs
        if not put:
            return Case((x, indices))
        res = torch.empty(shape, device="meta")[tuple(torch.zeros(i.shape, dtype=torch.long, device="meta")
                                                      if i is not None else slice(None) for i in indices)]
        vshape = draw(broadcast_to(tuple(res.shape)))
        vals = draw(tensors(vshape, dtype))
        return Case((x, indices, vals, accumulate))
    if name in ("masked_fill", "masked_fill_", "masked_scatter", "masked_scatter_", "masked_select"):
        mshape = draw(broadcast_to(shape))
        mask = draw(tensors(mshape, BOOL))
        if name.startswith("masked_fill"):
            v = draw(tensors((), dtype)) if overload == "Tensor" else draw(scalar_for(dtype))
            return Case((x, mask, v))
        if name == "masked_select":
            return Case((x, mask))
        return Case((x, mask, draw(tensors((numel(shape),), dtype))))
    if name == "take":
        return Case((x, index(draw(shapes(max_dims=2, cap=64)), numel(shape))))
    if name in ("put", "put_"):
        acc = draw(st.booleans())
        k = draw(st.integers(0, numel(shape)))
        return Case((x, index((k,), numel(shape), unique=not acc), draw(tensors((k,), dtype)), acc))
    if name == "embedding":
        w = draw(tensors((draw(st.sampled_from([1, 5, 33])), draw(st.sampled_from([1, 8, 128]))),
                         draw(dtypes(FLOATS)), special=False))
        idx = index(draw(shapes(max_dims=2, cap=64)), w.shape[0])
        pad = draw(st.sampled_from([-1, -1, 0]))
        return Case((w, idx, pad))
    if name == "nonzero":
        return Case((x,), grad=False)
    if name == "nonzero_static":
        return Case((x,), {"size": draw(st.integers(0, numel(shape) + 2)), "fill_value": -1}, grad=False)
    if name == "isin":
        other = draw(tensors(draw(shapes(max_dims=1, cap=16)), dtype))
        if overload == "Tensor_Scalar":
            return Case((x, draw(scalar_for(dtype))), {"invert": draw(st.booleans())})
        if overload == "Scalar_Tensor":
            return Case((draw(scalar_for(dtype)), other), {"invert": draw(st.booleans())})
        return Case((x, other), {"invert": draw(st.booleans())})
    raise Unsupported(name)
