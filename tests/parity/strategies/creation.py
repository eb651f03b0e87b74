"""Creation, random ops (compared on shape and dtype only), sorting."""
from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st


from strategies.base import (ALL, BF16, BOOL, Case, F16, F32, FLOATS, I32, I64, INTS, FromSpec, Spec, Unsupported,
    dtypes, scalar_for, shapes, tensors)
from strategies.elementwise import kthvalue
from strategies.shapes import raise_reject

# -- creation -----------------------------------------------------------------------------------------
FACTORY_KW = ("dtype", "layout", "device", "pin_memory")


@st.composite
def creation(draw, op):
    full = str(op)
    name = full.split(".")[1]
    ov = full.split(".")[2]
    dtype = draw(st.sampled_from([None, F32, BF16, F16, I32, I64, BOOL]))
    kw = {"device": torch.device("cpu")}
    if dtype is not None:
        kw["dtype"] = dtype
    size = list(draw(shapes()))
    meta = "empty" in name
    if name in ("zeros", "ones", "empty", "rand", "randn"):
        return Case((size,), kw, compare="meta" if meta else "values", grad=False)
    if name == "full":
        return Case((size, draw(scalar_for(dtype or F32))), kw, grad=False)
    if name == "scalar_tensor":
        return Case((draw(scalar_for(dtype or F32)),), kw, grad=False)
    if name == "empty_strided":
        stride = list(torch.empty(size).stride())
        return Case((size, stride), kw, compare="meta", grad=False)
    if name == "empty_permuted":
        return Case((size, list(draw(st.permutations(range(len(size)))))), kw, compare="meta", grad=False)
    if name == "eye":
        n = draw(st.sampled_from([0, 1, 3, 8, 33]))
        if ov == "m":
            return Case((n, draw(st.sampled_from([0, 1, 4, 9]))), kw, grad=False)
        return Case((n,), kw, grad=False)
    if name == "arange":
        fl = dtype is None or dtype.is_floating_point
        if dtype == BOOL:
            kw.pop("dtype")
        vals = [0, 1, 3, 7, 33, -5, 2.5, -1.5] if fl else [0, 1, 3, 7, 33, -5]
        start, end = draw(st.sampled_from(vals)), draw(st.sampled_from(vals))
        step = draw(st.sampled_from([1, 2, -1, 0.5, -3] if fl else [1, 2, -1, -3]))
        if step == 0 or (end - start) / step < 0 or (end - start) / step > 200:
            raise_reject(draw)
        if ov == "default":
            return Case((end,), kw, grad=False)
        if ov == "start":
            return Case((start, end), kw, grad=False)
        return Case((start, end, step), kw, grad=False)
    if name in ("linspace", "logspace"):
        if dtype == BOOL:
            kw.pop("dtype")
        start, end = draw(st.sampled_from([0, 1, -3, 2.5])), draw(st.sampled_from([0, 1, 10, -2.5]))
        steps = draw(st.sampled_from([0, 1, 2, 7, 33]))
        tdt = dtype if dtype is not None and dtype.is_floating_point else F32
        if ov.startswith("Tensor"):
            start = draw(tensors((), tdt, special=False))
        if ov.endswith("_Tensor"):
            end = draw(tensors((), tdt, special=False))
        args = (start, end, steps) + ((draw(st.sampled_from([10.0, 2.0])),) if name == "logspace" else ())
        return Case(args, kw, grad=False)
    if name in ("tril_indices", "triu_indices"):
        kw.pop("dtype", None)
        return Case((draw(st.integers(0, 9)), draw(st.integers(0, 9)), draw(st.integers(-3, 3))), kw, grad=False)
    # *_like, new_*, fill, zero_
    xd = draw(dtypes(ALL))
    x = draw(tensors(size, xd))
    if name in ("zeros_like", "ones_like", "empty_like", "rand_like", "randn_like"):
        return Case((x,), kw, compare="meta" if meta else "values", grad=False)
    if name == "full_like":
        return Case((x, draw(scalar_for(dtype or xd))), kw, grad=False)
    if name in ("new_zeros", "new_ones", "new_empty"):
        return Case((x, list(draw(shapes()))), kw, compare="meta" if meta else "values", grad=False)
    if name == "new_full":
        return Case((x, list(draw(shapes())), draw(scalar_for(dtype or xd))), kw, grad=False)
    if name == "new_empty_strided":
        s2 = list(draw(shapes()))
        return Case((x, s2, list(torch.empty(s2).stride())), kw, compare="meta", grad=False)
    if name in ("fill", "fill_"):
        if ov == "Tensor":
            return Case((x, draw(tensors((), xd))), grad=False)
        return Case((x, draw(scalar_for(xd))), grad=False)
    if name == "zero_":
        return Case((x,), grad=False)
    raise Unsupported(full)


# -- random ops: shape and dtype only -----------------------------------------------------------------
@st.composite
def random_op(draw, op):
    full = str(op)
    name = full.split(".")[1]
    sch = op._schema
    dtype = draw(dtypes(FLOATS))
    size = list(draw(shapes()))
    kw = {}
    args = []
    for a in sch.arguments:
        t, n = str(a.type), a.name
        if n == "self" or (t == "Tensor" and n in ("input", "mean", "std", "p")):
            vals = "prob" if n == "p" or name.startswith("bernoulli") or name == "multinomial" else "positive"
            sz = size
            if name == "multinomial":
                sz = size[-2:] if len(size) >= 1 else [3]
                sz = [s if s else 1 for s in sz] or [3]
            v = draw(tensors(sz, dtype, values=vals))
            if name.startswith("random") or name.startswith("randint_like"):
                v = draw(tensors(sz, draw(dtypes(FLOATS + INTS)), values="normal"))
        elif n == "size":
            v = size
        elif n in ("low", "from"):
            v = 0
        elif n in ("high", "to"):
            v = 5 if "Optional" not in t else draw(st.sampled_from([None, 5]))
        elif n == "n":
            v = draw(st.integers(0, 40))
        elif n == "num_samples":
            v = 1
        elif n == "p" and "float" in t:
            v = draw(st.sampled_from([0.0, 0.3, 1.0])) if name != "geometric" else 0.3
        elif n == "train":
            v = True
        elif n in ("mean", "std", "median", "sigma", "lambd") and "float" in t:
            v = 1.0
        elif n == "generator":
            if a.has_default_value():
                continue
            v = None
        elif n == "dtype" and name in ("rand", "randn", "randint", "randperm"):
            continue
        elif a.has_default_value():
            continue
        elif n == "grad_output" or n == "mask" or n == "scale":
            raise Unsupported(n)
        else:
            raise Unsupported(f"{full}: {n}")
        if a.kwarg_only:
            kw[n] = v
        else:
            args.append(v)
    if sch.arguments and sch.arguments[-1].name == "pin_memory":
        kw["device"] = torch.device("cpu")
    return Case(tuple(args), kw, compare="meta", grad=False)


# -- sorting and friends -------------------------------------------------------------------------------
@st.composite
def sorting(draw, op):
    full = str(op)
    name = full.split(".")[1]
    ov = full.split(".")[2]
    dtype = draw(dtypes(FLOATS + INTS))
    if name == "sort":
        shape = draw(shapes(min_dims=0))
        nd = len(shape)
        dim = -1 if nd == 0 else draw(st.sampled_from([-1, nd - 1]))
        x = draw(tensors(shape, dtype, values="distinct", layout="contiguous"))
        if ov == "stable":
            return Case((x,), {"stable": True, "dim": dim, "descending": draw(st.booleans())})
        return Case((x, dim, draw(st.booleans())))
    if name == "topk":
        shape = draw(shapes(min_dims=1))
        x = draw(tensors(shape, dtype, values="distinct", layout="contiguous"))
        return Case((x, draw(st.integers(0, shape[-1])), -1, draw(st.booleans()), True))
    if name in ("_unique2", "unique_consecutive"):
        x = draw(tensors(draw(shapes(max_dims=2)), dtype, values="int", low=-3, high=4))
        if name == "_unique2":
            return Case((x, True, draw(st.booleans()), draw(st.booleans())), grad=False)
        return Case((x, draw(st.booleans()), draw(st.booleans()), None), grad=False)
    if name == "bincount":
        x = draw(tensors((draw(st.integers(0, 40)),), I64, values="int", low=0, high=9))
        w = draw(tensors(x.shape, F32, values="positive")) if draw(st.booleans()) else None
        return Case((x, w, draw(st.integers(0, 12))), grad=False)
    if name in ("bucketize", "searchsorted"):
        b = draw(tensors((draw(st.integers(0, 9)),), dtype, values="distinct", layout="contiguous"))
        # boundaries must be sorted: a sorted recipe is a sort of a distinct one; use arange
        bnd = Spec(b.shape, dtype, 0, "int", "contiguous", 0, 1)
        bnd = _Sorted(b)
        right = draw(st.booleans())
        if ov == "Scalar":
            v = draw(scalar_for(dtype))
            if name == "bucketize":
                return Case((v, bnd), {"right": right}, grad=False)
            return Case((bnd, v), {"right": right}, grad=False)
        x = draw(tensors(draw(shapes(max_dims=2)), dtype))
        if name == "bucketize":
            return Case((x, bnd), {"right": right, "out_int32": draw(st.booleans())}, grad=False)
        return Case((bnd, x), {"right": right}, grad=False)
    if name == "histc":
        x = draw(tensors(draw(shapes()), draw(dtypes(FLOATS))))
        lo = draw(st.sampled_from([0, -1]))
        return Case((x, draw(st.integers(1, 12)), lo, draw(st.sampled_from([0, 1, 2]))), grad=False)
    if name in ("kthvalue",):
        return draw(kthvalue(op))
    raise Unsupported(full)


@dataclasses.dataclass(frozen=True)
class _Sorted(FromSpec):
    """A sorted 1-D tensor (searchsorted boundaries)."""
    spec: Spec

    def build(self, device="cpu"):
        t = self.spec.build("cpu").sort().values
        return t if device == "cpu" else t.to(device)
