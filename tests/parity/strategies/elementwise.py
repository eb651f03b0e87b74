"""Schema-driven families: elementwise ops (every Tensor argument broadcasts against the
first), reductions and scans, softmax."""
from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st


from strategies.base import (ALL, BOOL, Case, F16, F32, FLOATS, INTS, Unsupported, _DEFAULT, _OnCpu,
    _param, broadcast_to, dtypes, scalar_for, shapes, tensors, valid_dim)

def elementwise(op, allowed=ALL, values=None):
    """Every Tensor argument broadcasts with the first; lists for ``_foreach``."""
    schema = op._schema
    argdefs = list(schema.arguments)
    for a in argdefs:  # fail at table-build time when a required arg has no rule
        t = str(a.type)
        if t in ("Tensor", "Optional[Tensor]", "List[Tensor]", "List[number]", "number",
                 "Optional[number]", "bool", "float", "Optional[float]", "int", "Optional[str]", "str",
                 "Optional[int]"):
            continue
        if not a.has_default_value():
            raise Unsupported(f"{op}: argument {a.name}: {t}")
    inplace = any(a.alias_info is not None and a.alias_info.is_write for a in argdefs)
    has_out = any(a.name == "out" for a in argdefs)

    @st.composite
    def draw_case(draw) -> Case:
        dtype = draw(dtypes(allowed))
        shape = draw(shapes())
        nlist = draw(st.integers(1, 3))
        list_shapes = [draw(shapes(max_dims=3)) for _ in range(nlist)]
        args, kwargs = [], {}
        first = True
        for a in argdefs:
            t = str(a.type)
            if t in ("Tensor", "Optional[Tensor]"):
                dt = BOOL if a.name in ("condition", "mask") else dtype
                if a.name == "n" and "polynomial" in str(op):   # polynomial degree: CPU loops n times
                    v = draw(tensors(draw(broadcast_to(shape)), dtype, values="int", low=-1, high=7))
                    args.append(v)
                    first = False
                    continue
                if not first and dt == dtype and draw(st.integers(0, 7)) == 0:
                    dt = draw(dtypes(allowed))           # mixed dtypes: type promotion
                if a.name == "scalars":
                    args.append(_OnCpu(draw(tensors((len(list_shapes),), F32, layout="contiguous"))))
                    first = False
                    continue
                if a.name == "out":
                    v = draw(tensors(shape, dtype, layout="contiguous"))
                    kwargs[a.name] = v
                    continue
                if first and (inplace or has_out or draw(st.integers(0, 3)) > 0):
                    shp = shape
                else:
                    shp = draw(broadcast_to(shape))
                v = draw(tensors(shp, dt, values=values))
                first = False
            elif t == "List[Tensor]":
                v = [draw(tensors(s, dtype, values=values)) for s in list_shapes]
                first = False
            elif t == "List[number]":
                v = [draw(scalar_for(dtype)) for _ in list_shapes]

            elif t in ("Optional[str]", "str") and a.name != "rounding_mode":
                if a.has_default_value():
                    continue
                raise Unsupported(a.name)
            else:
                v = _param(a.name, t, dtype, a.has_default_value(), draw)
                if v is _DEFAULT:
                    continue
            if a.kwarg_only:
                kwargs[a.name] = v
            else:
                args.append(v)
        return Case(tuple(args), kwargs)
    return draw_case()


# -- reductions, scans, sorts (schema-driven) ------------------------------------------------
def reduction(op, allowed=ALL, values=None, min_dims=0):
    argdefs = list(op._schema.arguments)

    @st.composite
    def draw_case(draw) -> Case:
        dtype = draw(dtypes(allowed))
        shape = draw(shapes(min_dims=min_dims))
        if str(op).startswith("aten.trace"):
            shape = draw(shapes(min_dims=2, max_dims=2))
        nd = len(shape)
        args, kwargs = [], {}
        for i, a in enumerate(argdefs):
            t = str(a.type)
            n = a.name
            if i == 0:
                v = draw(tensors(shape, dtype, values=values))
            elif t == "Tensor":
                v = draw(tensors(shape, dtype, values=values))
            elif n in ("dim", "dims", "dimension") and t == "List[int]":
                ds = draw(st.lists(st.integers(0, max(nd - 1, 0)), unique=True, max_size=max(nd, 0)))
                if nd == 0:
                    ds = draw(st.sampled_from([[], [0], [-1]]))
                v = [d - nd if draw(st.booleans()) and nd else d for d in ds]
                if not v and a.has_default_value() and draw(st.booleans()):
                    continue
            elif n in ("dim", "dims") and t == "Optional[List[int]]":
                if draw(st.booleans()):
                    v = None
                else:
                    v = draw(st.lists(st.integers(0, max(nd - 1, 0)), unique=True, min_size=1, max_size=max(nd, 1)))
            elif n in ("dim", "dimension") and t == "int":
                v = draw(valid_dim(nd))
            elif n == "dim" and t == "Optional[int]":
                v = draw(st.one_of(st.none(), valid_dim(nd)))
            elif n == "keepdim" or n in ("unbiased", "descending", "largest", "sorted", "stable", "right",
                                         "out_int32", "equal_nan"):
                if t == "Optional[bool]":
                    v = draw(st.sampled_from([None, True, False]))
                else:
                    v = draw(st.booleans())
            elif n == "dtype" and a.has_default_value():
                v = draw(st.sampled_from([None, None, None, torch.float32, torch.int64]))
                if v is None:
                    continue
            elif n == "dtype":
                v = draw(st.sampled_from([torch.float32, dtype]))
            elif n == "correction":
                v = draw(st.sampled_from([None, 0, 1, 2]))
            elif n in ("p", "ord"):
                v = draw(st.sampled_from([2, 1, 3, 0, float("inf"), float("-inf"), 0.5] +
                                         ([None] if "Optional" in t else [])))
            elif n in ("rtol", "atol"):
                continue
            elif a.has_default_value():
                continue
            else:
                raise Unsupported(f"{op}: argument {n}: {t}")
            if a.kwarg_only:
                kwargs[n] = v
            else:
                args.append(v)
        return Case(tuple(args), kwargs)
    return draw_case()


@st.composite
def kthvalue(draw, op, allowed=FLOATS + INTS, k_name="k", k_first=True):
    """kthvalue / topk: k within the reduced dim's size (distinct values: no ties)."""
    dtype = draw(dtypes(allowed))
    shape = draw(shapes(min_dims=1, min_side=1))
    dim = draw(valid_dim(len(shape)))
    size = shape[dim]
    x = draw(tensors(shape, dtype, values="distinct", layout="contiguous"))
    if len(shape) and dim % len(shape) != len(shape) - 1:
        x = dataclasses.replace(x, values="normal")   # ties across rows do not matter; within
    k = draw(st.integers(1 if k_name == "k" and "kthvalue" in str(op) else 0, size))
    if str(op).startswith("aten.topk"):
        return Case((x, k, dim, draw(st.booleans()), True))
    return Case((x, max(k, 1), dim, draw(st.booleans())))


# -- softmax ------------------------------------------------------------------------------------
@st.composite
def softmax(draw, op):
    dtype = draw(dtypes(FLOATS))
    shape = draw(shapes())
    x = draw(tensors(shape, dtype))
    dim = draw(valid_dim(len(shape)))
    name = str(op)
    if "safe_softmax" in name:
        return Case((x, dim))
    half_to_float = dtype == F16 and draw(st.booleans()) and False   # CPU: only with CUDA
    return Case((x, dim, half_to_float))


@st.composite
def item(draw, op):
    """``_local_scalar_dense`` (``.item()``): a one-element tensor of any dtype."""
    dtype = draw(dtypes(ALL))
    shape = draw(st.sampled_from([(), (1,), (1, 1)]))
    return Case((draw(tensors(shape, dtype)),), grad=False)
