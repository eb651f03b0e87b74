"""Hypothesis strategies that draw valid calls of ATen ops, by op family.

A strategy draws a ``Case``: the op's positional and keyword arguments, where tensors are
``Spec`` recipes (shape, dtype, seed, value kind, memory layout) that build the same
values on CPU and on tpu (``tpu_kernels.testing.make_tensor``), so a non-contiguous input
is non-contiguous on both devices and a failure prints as a short reproducer.

Families (each a function ``op -> strategy``): ``elementwise`` (schema-driven: every
Tensor argument broadcasts against the first, Scalars are Python numbers, tensor lists
for ``_foreach``), ``reduction`` (schema-driven: dim lists, keepdim, dtype, correction,
p), ``softmax``, ``matmul``, ``norm``, ``conv``/``pool``, ``indexing``, ``shape``,
``creation``, ``random`` (compared on shape and dtype only), ``sorting``, ``loss``,
``linalg`` and ``backward`` (the backward op's arguments captured from CPU autograd of
its forward op's drawn case). Dtypes are drawn from float32, bfloat16, float16, int32,
int64, bool; a case CPU torch rejects is not a case (the test discards it).

Shapes include 0-d, zero-size, size-1, odd (7, 33, 129) and TPU-friendly (8x128) sizes;
the ``ci`` profile caps element counts (``max_numel``) to keep compiles cheap.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from hypothesis import settings
from hypothesis import strategies as st

from tpu_kernels.testing import make_tensor

F32, BF16, F16, I32, I64, BOOL = torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.bool
FLOATS = (F32, BF16, F16)
INTS = (I32, I64)
ALL = FLOATS + INTS + (BOOL,)


def thorough() -> bool:
    return settings().max_examples >= 100


def max_numel() -> int:
    return 1 << 15 if thorough() else 1 << 11


# sizes: small ones often, odd and TPU-friendly ones sometimes
SIZES = [0, 1, 1, 2, 2, 3, 3, 4, 5, 7, 8, 16, 33, 128, 129]


# -- tensors ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Spec:
    """A tensor recipe; ``build(device)`` makes it (see ``make_tensor``)."""
    shape: tuple
    dtype: torch.dtype
    seed: int = 0
    values: str = "normal"
    layout: str = "contiguous"
    low: Any = None
    high: Any = None
    requires_grad: bool = False

    def build(self, device: str = "cpu") -> torch.Tensor:
        return make_tensor(self.shape, self.dtype, self.seed, self.values, self.layout, self.low,
                           self.high, device=device)


@dataclasses.dataclass(frozen=True)
class Concrete:
    """A tensor captured from a CPU run (backward ops' arguments)."""
    tensor: torch.Tensor

    @property
    def dtype(self):
        return self.tensor.dtype

    @property
    def shape(self):
        return tuple(self.tensor.shape)

    def build(self, device: str = "cpu") -> torch.Tensor:
        t = self.tensor.detach().clone()
        return t if device == "cpu" else t.to(device)


@dataclasses.dataclass
class Case:
    """One drawn call. ``compare``: "values", or "meta" (shape and dtype only: random and
    uninitialised results). ``grad``: gradients may be compared (float inputs)."""
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    compare: str = "values"
    grad: bool = True

    def build(self, device: str = "cpu") -> tuple[tuple, dict]:
        return _build(self.args, device), {k: _build(v, device) for k, v in self.kwargs.items()}

    def dtypes(self) -> set:
        out = set()

        def visit(x):
            if hasattr(x, "build") and not isinstance(x, torch.Tensor):
                out.add(x.dtype)
            elif isinstance(x, (list, tuple)):
                for y in x:
                    visit(y)
        visit(self.args)
        visit(list(self.kwargs.values()))
        return out

    def __repr__(self) -> str:
        return f"Case(args={self.args!r}, kwargs={self.kwargs!r})"


def _build(x: Any, device: str) -> Any:
    if hasattr(x, "build") and not isinstance(x, torch.Tensor):
        return x.build(device)
    if isinstance(x, list):
        return [_build(y, device) for y in x]
    if isinstance(x, tuple):
        return tuple(_build(y, device) for y in x)
    if isinstance(x, torch.device):
        return torch.device(device)
    return x


def numel(shape) -> int:
    return math.prod(shape) if shape else 1


@st.composite
def shapes(draw, min_dims: int = 0, max_dims: int = 4, min_side: int = 0, cap: int | None = None,
           sizes: list | None = None) -> tuple:
    cap = cap or max_numel()
    if draw(st.integers(0, 9)) == 0 and max_dims >= 2 and min_dims <= 2:
        return (8, 128)                              # TPU tile shape
    nd = draw(st.integers(min_dims, max_dims))
    pool = [s for s in (sizes or SIZES) if s >= min_side]
    dims = [draw(st.sampled_from(pool)) for _ in range(nd)]
    while numel(dims) > cap:                         # shrink the biggest side
        i = max(range(nd), key=lambda j: dims[j])
        dims[i] = max(min_side, min(3, dims[i] // 4))
    return tuple(dims)


LAYOUTS = ["contiguous"] * 4 + ["transposed", "stepped", "expanded", "offset"]


@st.composite
def tensors(draw, shape, dtype, values: str | None = None, layout: str | None = None, low=None,
            high=None, special: bool = True) -> Spec:
    seed = draw(st.integers(0, 2 ** 16))
    if values is None:
        values = draw(st.sampled_from(["normal", "normal", "special"] if special else ["normal"]))
    if layout is None:
        layout = draw(st.sampled_from(LAYOUTS))
        if layout == "transposed" and len(shape) < 2 or layout in ("stepped", "expanded") and not shape:
            layout = "contiguous"
    return Spec(tuple(shape), dtype, seed, values, layout, low, high)


def dtypes(allowed=ALL):
    return st.sampled_from(list(allowed))


@st.composite
def broadcast_to(draw, shape) -> tuple:
    """A shape that broadcasts to ``shape``: trailing dims kept, some set to 1, some dropped."""
    k = draw(st.integers(0, len(shape)))
    tail = list(shape[len(shape) - k:])
    return tuple(1 if draw(st.integers(0, 3)) == 0 else s for s in tail)


def scalar_for(dtype, values=(0, 1, -1, 2, 3, -2.5, 0.5, 1e-3)):
    if dtype == BOOL:
        return st.sampled_from([True, False])
    if not dtype.is_floating_point:
        return st.sampled_from([v for v in values if float(v).is_integer()] + [7, -5])
    return st.sampled_from(list(values) + [float("inf"), float("nan"), 1e4])


def valid_dim(ndim: int):
    n = max(ndim, 1)
    return st.integers(-n, n - 1)


# -- elementwise (schema-driven) -----------------------------------------------------------
# Non-tensor arguments by name: how to draw them (given the first tensor's dtype).
def _param(name: str, type_: str, dtype, has_default: bool, draw) -> Any:
    if name == "rounding_mode":
        return draw(st.sampled_from([None, "trunc", "floor"]))
    if name == "decimals":
        return draw(st.integers(-1, 3))
    if name == "approximate":
        return draw(st.sampled_from(["none", "tanh"]))
    if name == "alpha" or name == "beta":
        return draw(st.sampled_from([1, 2, -1] if not dtype.is_floating_point else [1, 0.5, -2.0, 2]))
    if name in ("eps",) and "float" in type_:
        return draw(st.sampled_from([None, 1e-6, 0.1])) if "Optional" in type_ else 1e-5
    if name in ("nan", "posinf", "neginf"):
        return draw(st.sampled_from([None, 0.0, 1.0, -7.5]))
    if name in ("min", "max") and type_ in ("Optional[number]", "number"):
        return draw(st.sampled_from([None, -1, 0.5, 2] if "Optional" in type_ else [-1, 0.5, 2]))
    if name == "exponent" and type_ == "number":
        return draw(st.sampled_from([2, 3, 0, 1, -1, 0.5, -2, 2.5]))
    if name in ("value", "other", "self", "weight", "element", "test_element", "s", "fill_value") and type_ == "number":
        return draw(scalar_for(dtype))
    if name == "n" and type_ == "number":     # polynomial degree: CPU loops n times
        return draw(st.integers(-1, 6))
    if type_ == "number":
        return draw(scalar_for(dtype))
    if name == "n" and type_ == "int":        # polygamma order
        return draw(st.integers(0, 3))
    if name == "p" and type_ == "int":        # mvlgamma dimension
        return draw(st.integers(1, 3))
    if name == "dim" and type_ == "int":      # renorm
        return 0
    if type_ == "bool":
        return draw(st.booleans())
    if has_default:
        return _DEFAULT
    raise Unsupported(f"no rule for argument {name}: {type_}")


class Unsupported(Exception):
    """The family cannot draw this op's arguments."""


_DEFAULT = object()


@dataclasses.dataclass(frozen=True)
class _OnCpu:
    """A tensor torch wants on the CPU whatever the device (``_foreach_*`` scalars)."""
    spec: Spec

    @property
    def dtype(self):
        return self.spec.dtype

    def build(self, device="cpu"):
        return self.spec.build("cpu")


def _tensor_arg(a) -> bool:
    return str(a.type) in ("Tensor", "Optional[Tensor]")


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


# -- matmul family ------------------------------------------------------------------------------
MM_SIZES = [0, 1, 2, 3, 7, 8, 16, 33, 128]


@st.composite
def matmul(draw, op, allowed=FLOATS + INTS):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(allowed))
    m, k, n = (draw(st.sampled_from(MM_SIZES)) for _ in range(3))
    b = draw(st.sampled_from([0, 1, 2, 3]))
    while m * k * n * max(b, 1) > 4 * max_numel():
        m, k, n = max(1, m // 4), max(1, k // 2), max(1, n // 4)

    def t(*shape):
        return draw(tensors(shape, dtype, special=False))

    ab = {}
    if dtype.is_floating_point:
        ab = {"beta": draw(st.sampled_from([1, 0.5, 0])), "alpha": draw(st.sampled_from([1, 2.0]))}
    else:
        ab = {"beta": draw(st.sampled_from([1, 0])), "alpha": draw(st.sampled_from([1, 2]))}
    if name == "mm":
        return Case((t(m, k), t(k, n)))
    if name == "bmm":
        return Case((t(b, m, k), t(b, k, n)))
    if name == "addmm":
        return Case((t(*draw(broadcast_to((m, n)))), t(m, k), t(k, n)), ab)
    if name == "baddbmm":
        return Case((t(*draw(broadcast_to((b, m, n)))), t(b, m, k), t(b, k, n)), ab)
    if name == "addbmm":
        return Case((t(*draw(broadcast_to((m, n)))), t(b, m, k), t(b, k, n)), ab)
    if name == "addmv":
        return Case((t(*draw(broadcast_to((m,)))), t(m, k), t(k)), ab)
    if name == "addr":
        return Case((t(*draw(broadcast_to((m, n)))), t(m), t(n)), ab)
    if name == "mv":
        return Case((t(m, k), t(k)))
    if name in ("dot", "vdot"):
        return Case((t(k), t(k)))
    raise Unsupported(name)


# -- normalisation ----------------------------------------------------------------------------------
@st.composite
def norm(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(FLOATS))
    eps = draw(st.sampled_from([1e-5, 1e-3]))

    def t(shape, **kw):
        return draw(tensors(shape, dtype, special=False, **kw))
    if name == "native_layer_norm":
        shape = draw(shapes(min_dims=1, max_dims=3))
        k = draw(st.integers(1, len(shape)))
        ns = list(shape[len(shape) - k:])
        w = t(ns) if draw(st.booleans()) else None
        b = t(ns) if draw(st.booleans()) else None
        return Case((t(shape), ns, w, b, eps))
    if name == "_fused_rms_norm":
        shape = draw(shapes(min_dims=1, max_dims=3))
        k = draw(st.integers(1, len(shape)))
        ns = list(shape[len(shape) - k:])
        w = t(ns) if draw(st.booleans()) else None
        return Case((t(shape), ns, w, draw(st.sampled_from([None, 1e-6]))))
    if name == "native_group_norm":
        g = draw(st.sampled_from([1, 2, 3]))
        c = g * draw(st.sampled_from([1, 2, 4]))
        n = draw(st.sampled_from([1, 2, 3]))
        hw = draw(st.sampled_from([(1,), (5,), (4, 4), (3, 7)]))
        w = t([c]) if draw(st.booleans()) else None
        b = t([c]) if draw(st.booleans()) else None
        return Case((t((n, c) + hw), w, b, n, c, numel(hw), g, eps))
    if name == "_weight_norm_interface":
        shape = draw(shapes(min_dims=1, max_dims=3, min_side=1))
        dim = draw(st.integers(0, len(shape) - 1))
        gshape = [s if i == dim else 1 for i, s in enumerate(shape)]
        return Case((t(shape), t(gshape, values="positive"), dim))
    # batch norms
    n = draw(st.sampled_from([2, 3, 8]))
    c = draw(st.sampled_from([1, 3, 16]))
    rest = draw(st.sampled_from([(), (5,), (4, 4)]))
    x = t((n, c) + rest)
    w = t([c]) if draw(st.booleans()) else None
    b = t([c]) if draw(st.booleans()) else None
    stat_dtype = F32 if dtype != F32 and draw(st.booleans()) else dtype
    rm = draw(tensors([c], stat_dtype, special=False, layout="contiguous"))
    rv = draw(tensors([c], stat_dtype, values="positive", layout="contiguous"))
    mom = draw(st.sampled_from([0.1, 0.5]))
    if name == "native_batch_norm":
        training = draw(st.booleans())
        use_stats = draw(st.booleans()) or not training
        return Case((x, w, b, rm if use_stats else None, rv if use_stats else None, training, mom, eps))
    if name == "_native_batch_norm_legit":
        if str(op).endswith("no_stats"):
            return Case((x, w, b, True, mom, eps))
        return Case((x, w, b, rm, rv, draw(st.booleans()), mom, eps))
    if name == "_native_batch_norm_legit_no_training":
        return Case((x, w, b, rm, rv, mom, eps))
    if name in ("_batch_norm_with_update", "_batch_norm_with_update_functional", "_batch_norm_no_update"):
        return Case((x, w, b, rm, rv, mom, eps))
    raise Unsupported(name)


# -- convolution and pooling -----------------------------------------------------------------------
@st.composite
def conv(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(FLOATS))
    nd = draw(st.sampled_from([1, 2, 2, 3]))
    if name == "convolution":
        groups = draw(st.sampled_from([1, 1, 2]))
        cin = groups * draw(st.sampled_from([1, 3]))
        cout = groups * draw(st.sampled_from([1, 2, 4]))
        n = draw(st.sampled_from([1, 2]))
        k = [draw(st.sampled_from([1, 2, 3])) for _ in range(nd)]
        stride = [draw(st.sampled_from([1, 2])) for _ in range(nd)]
        pad = [draw(st.sampled_from([0, 1])) for _ in range(nd)]
        dil = [draw(st.sampled_from([1, 2])) for _ in range(nd)]
        transposed = draw(st.booleans())
        size = [draw(st.sampled_from([5, 7, 8] if nd < 3 else [4, 5])) for _ in range(nd)]
        for i in range(nd):  # the input must cover the dilated kernel
            size[i] = max(size[i], dil[i] * (k[i] - 1) + 1)
        x = draw(tensors((n, cin, *size), dtype, special=False))
        if transposed:
            outp = [draw(st.integers(0, max(0, min(stride[i], dil[i]) - 1))) for i in range(nd)]
            w = draw(tensors((cin, cout // groups, *k), dtype, special=False))
        else:
            outp = [0] * nd
            w = draw(tensors((cout, cin // groups, *k), dtype, special=False))
        bias = draw(tensors((cout,), dtype, special=False)) if draw(st.booleans()) else None
        return Case((x, w, bias, stride, pad, dil, transposed, outp, groups))
    if name in ("im2col", "col2im"):
        k = [draw(st.sampled_from([1, 2, 3])) for _ in range(2)]
        dil = [draw(st.sampled_from([1, 2])) for _ in range(2)]
        pad = [draw(st.sampled_from([0, 1])) for _ in range(2)]
        stride = [draw(st.sampled_from([1, 2])) for _ in range(2)]
        size = [draw(st.sampled_from([5, 7, 8])) for _ in range(2)]
        c = draw(st.sampled_from([1, 3]))
        n = draw(st.sampled_from([1, 2]))
        if name == "im2col":
            return Case((draw(tensors((n, c, *size), dtype)), k, dil, pad, stride))
        blocks = [(size[i] + 2 * pad[i] - dil[i] * (k[i] - 1) - 1) // stride[i] + 1 for i in range(2)]
        if min(blocks) < 1:
            raise Unsupported("no blocks")
        cols = draw(tensors((n, c * k[0] * k[1], blocks[0] * blocks[1]), dtype))
        return Case((cols, size, k, dil, pad, stride))
    raise Unsupported(name)


@st.composite
def pool(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(FLOATS))
    nd = 3 if "3d" in name else 1 if "1d" in name else 2
    n_batch = draw(st.sampled_from([(), (1,), (2,)]))
    c = draw(st.sampled_from([1, 3]))
    size = [draw(st.sampled_from([4, 5, 7, 8] if nd < 3 else [3, 4, 5])) for _ in range(nd)]
    x = draw(tensors(n_batch + (c, *size), dtype, values="distinct" if "max" in name else None))
    if name.startswith("_adaptive") or name.startswith("adaptive"):
        out = [draw(st.integers(1, s + 1)) for s in size]
        return Case((x, out))
    k = [draw(st.sampled_from([1, 2, 3])) for _ in range(nd)]
    stride = [draw(st.sampled_from([1, 2, 3])) for _ in range(nd)] if draw(st.booleans()) else []
    pad = [draw(st.integers(0, kk // 2)) for kk in k]
    ceil = draw(st.booleans())
    if name.startswith("max_pool"):
        dil = [draw(st.sampled_from([1, 2])) for _ in range(nd)]
        for i in range(nd):
            if dil[i] * (k[i] - 1) + 1 > size[i] + 2 * pad[i]:
                dil[i] = 1
        return Case((x, k, stride, pad, dil, ceil))
    if name.startswith("avg_pool"):
        cip = draw(st.booleans())
        if nd == 1:
            return Case((x, k, stride, pad, ceil, cip))
        div = draw(st.sampled_from([None, None, 3]))
        return Case((x, k, stride, pad, ceil, cip, div))
    if name.startswith("fractional_max_pool"):
        k = [draw(st.sampled_from([1, 2])) for _ in range(nd)]
        out = [draw(st.integers(1, s - kk + 1)) for s, kk in zip(size, k)]
        nb = n_batch[0] if n_batch else 1
        samples = draw(tensors((nb, c, nd), dtype, values="prob", layout="contiguous"))
        return Case((x, k, out, samples), compare="values", grad=False)
    raise Unsupported(name)


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
class _Sorted:
    """A sorted 1-D tensor (searchsorted boundaries)."""
    spec: Spec

    @property
    def dtype(self):
        return self.spec.dtype

    @property
    def shape(self):
        return self.spec.shape

    def build(self, device="cpu"):
        t = self.spec.build("cpu").sort().values
        return t if device == "cpu" else t.to(device)


# -- losses ----------------------------------------------------------------------------------------------
@st.composite
def loss(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(FLOATS))
    red = draw(st.sampled_from([0, 1, 2]))
    shape = draw(shapes(min_dims=0, max_dims=3))
    if name in ("mse_loss", "huber_loss", "smooth_l1_loss", "soft_margin_loss", "binary_cross_entropy",
                "binary_cross_entropy_with_logits"):
        vals = "prob" if name == "binary_cross_entropy" else None
        x = draw(tensors(shape, dtype, values=vals))
        y = draw(tensors(shape, dtype, values="prob" if "binary" in name else None))
        if name == "soft_margin_loss":
            y = draw(tensors(shape, dtype, values="int", low=0, high=2))
        if name in ("huber_loss", "smooth_l1_loss"):
            return Case((x, y, red, draw(st.sampled_from([1.0, 0.5, 2.0]))))
        if name == "binary_cross_entropy":
            w = draw(tensors(shape, dtype, values="positive")) if draw(st.booleans()) else None
            return Case((x, y, w, red))
        if name == "binary_cross_entropy_with_logits":
            w = draw(tensors(draw(broadcast_to(shape)), dtype, values="positive")) if draw(st.booleans()) else None
            pw = draw(tensors(shape[-1:], dtype, values="positive")) if shape and draw(st.booleans()) else None
            return Case((x, y, w, pw, red))
        return Case((x, y, red))
    n = draw(st.sampled_from([1, 3, 8]))
    c = draw(st.sampled_from([1, 2, 5, 33]))
    if name in ("nll_loss_forward", "nll_loss2d_forward"):
        extra = (draw(st.sampled_from([1, 3])), draw(st.sampled_from([2, 4]))) if "2d" in name else ()
        nbatch = (n,) if "2d" in name or draw(st.booleans()) else ()
        x = draw(tensors(nbatch + (c,) + extra, dtype))
        t = draw(tensors(nbatch + extra, I64, values="int", low=0, high=c, layout="contiguous"))
        w = draw(tensors((c,), dtype, values="positive")) if draw(st.booleans()) else None
        ign = draw(st.sampled_from([-100, 0]))
        return Case((x, t, w, red, ign))
    if name == "multi_margin_loss":
        x = draw(tensors((n, c), dtype))
        t = draw(tensors((n,), I64, values="int", low=0, high=c, layout="contiguous"))
        w = draw(tensors((c,), dtype, values="positive")) if draw(st.booleans()) else None
        return Case((x, t, draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 0.5])), w, red))
    if name == "multilabel_margin_loss_forward":
        x = draw(tensors((n, c), dtype))
        t = draw(tensors((n, c), I64, values="int", low=-1, high=c, layout="contiguous"))
        return Case((x, t, red))
    raise Unsupported(name)


# -- linear algebra with unique answers ---------------------------------------------------------------------
@st.composite
def linalg(draw, op):
    name = str(op).split(".")[1]
    dtype = F32 if not thorough() else draw(dtypes((F32,)))
    n = draw(st.sampled_from([1, 2, 3, 5, 8]))
    k = draw(st.sampled_from([1, 2, 4]))
    batch = draw(st.sampled_from([(), (2,)]))
    if name in ("linalg_solve_triangular", "triangular_solve"):
        upper = draw(st.booleans())
        a = _WellConditioned(draw(tensors(batch + (n, n), dtype, special=False)), "tri", upper)
        if name == "triangular_solve":
            b = draw(tensors(batch + (n, k), dtype, special=False))
            return Case((b, a, upper, draw(st.booleans()), draw(st.booleans())))
        left = draw(st.booleans())
        b = draw(tensors(batch + ((n, k) if left else (k, n)), dtype, special=False))
        return Case((a, b), {"upper": upper, "left": left, "unitriangular": draw(st.booleans())})
    if name in ("cholesky", "linalg_cholesky_ex"):
        a = _WellConditioned(draw(tensors(batch + (n, n), dtype, special=False)), "spd", False)
        if name == "cholesky":
            return Case((a, draw(st.booleans())))
        return Case((a,), {"upper": draw(st.booleans())})
    if name in ("linalg_inv_ex", "_linalg_det", "linalg_matrix_exp"):
        a = _WellConditioned(draw(tensors(batch + (n, n), dtype, special=False)), "diag", False)
        return Case((a,))
    if name == "_linalg_solve_ex":
        a = _WellConditioned(draw(tensors(batch + (n, n), dtype, special=False)), "diag", False)
        return Case((a, draw(tensors(batch + (n, k), dtype, special=False))))
    if name == "linalg_cross":
        shape = draw(shapes(max_dims=2)) + (3,)
        return Case((draw(tensors(shape, dtype)), draw(tensors(shape, dtype))), {"dim": -1})
    raise Unsupported(name)


@dataclasses.dataclass(frozen=True)
class _WellConditioned:
    """A square matrix made well conditioned: triangular with a dominant diagonal,
    symmetric positive definite, or diagonally dominant."""
    spec: Spec
    kind: str
    upper: bool

    @property
    def dtype(self):
        return self.spec.dtype

    @property
    def shape(self):
        return self.spec.shape

    def build(self, device="cpu"):
        a = self.spec.build("cpu").to(torch.float64)
        n = a.shape[-1]
        eye = torch.eye(n, dtype=torch.float64)
        if self.kind == "tri":
            a = (a.triu() if self.upper else a.tril()) / n + eye * 2
        elif self.kind == "spd":
            a = a @ a.transpose(-1, -2) / n + eye
        else:
            a = a / n + eye * 2
        a = a.to(self.spec.dtype)
        return a if device == "cpu" else a.to(device)


# -- custom ops and fused optimizers ---------------------------------------------------------------------------
@st.composite
def custom(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes((F32, BF16)))
    n = draw(st.sampled_from([1, 8, 13]))
    v = draw(st.sampled_from([7, 128, 200]))
    red = draw(st.sampled_from(["mean", "sum", "none"]))
    ign = draw(st.sampled_from([-100, 0]))
    tgt = draw(tensors((n,), I64, values="int", low=0, high=v, layout="contiguous"))
    if name == "cross_entropy":
        logits = draw(tensors((n, v), dtype, special=False))
        return Case((logits, tgt, None, ign, red, draw(st.sampled_from([0.0, 0.1]))))
    if name == "linear_cross_entropy":
        h = draw(st.sampled_from([8, 128]))
        return Case((draw(tensors((n, h), dtype, special=False)), draw(tensors((v, h), dtype, special=False)),
                     tgt, ign, red, draw(st.sampled_from([0.0, 0.1]))))
    if name == "ragged_dot":
        g = draw(st.sampled_from([1, 2, 4]))
        m, k, nn = draw(st.sampled_from([8, 16])), draw(st.sampled_from([8, 128])), draw(st.sampled_from([8, 128]))
        sizes = _GroupSizes(m, g, draw(st.integers(0, 2 ** 16)))
        return Case((draw(tensors((m, k), dtype, special=False)), draw(tensors((g, k, nn), dtype, special=False)),
                     sizes))
    raise Unsupported(name)


@dataclasses.dataclass(frozen=True)
class _GroupSizes:
    m: int
    g: int
    seed: int
    dtype = I32

    @property
    def shape(self):
        return (self.g,)

    def build(self, device="cpu"):
        gen = torch.Generator().manual_seed(self.seed)
        cuts = torch.sort(torch.randint(0, self.m + 1, (self.g - 1,), generator=gen)).values
        edges = torch.cat([torch.tensor([0]), cuts, torch.tensor([self.m])])
        t = (edges[1:] - edges[:-1]).to(torch.int32)
        return t if device == "cpu" else t.to(device)


@st.composite
def fused_adam(draw, op):
    dtype = draw(dtypes((F32, BF16)))
    k = draw(st.integers(1, 3))
    shapes_ = [draw(shapes(max_dims=2, cap=256)) for _ in range(k)]

    def lst(values=None):
        return [draw(tensors(s, dtype, values=values, layout="contiguous", special=False)) for s in shapes_]
    amsgrad = draw(st.booleans())
    steps = [draw(tensors((), F32, values="int", low=1, high=9)) for _ in shapes_]
    kw = dict(lr=draw(st.sampled_from([1e-3, 0.1])), beta1=0.9, beta2=0.999,
              weight_decay=draw(st.sampled_from([0.0, 0.01])), eps=1e-8, amsgrad=amsgrad,
              maximize=draw(st.booleans()))
    return Case((lst(), lst(), lst(), lst("positive"), lst("positive") if amsgrad else [], steps), kw, grad=False)


# -- backward ops: arguments captured from CPU autograd of the forward op ---------------------------
class _Capture:
    """Records the arguments of every call of ``target`` (a TorchDispatchMode)."""

    def __init__(self, target):
        from torch.utils._python_dispatch import TorchDispatchMode
        calls = self.calls = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is target:
                    calls.append(_clone_tree((args, kwargs)))
                return func(*args, **kwargs)
        self.mode = Mode()


def _clone_tree(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_clone_tree(y) for y in x)
    if isinstance(x, dict):
        return {k: _clone_tree(v) for k, v in x.items()}
    return x


def _concrete_tree(x):
    if isinstance(x, torch.Tensor):
        return Concrete(x)
    if isinstance(x, dict):
        return {k: _concrete_tree(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_concrete_tree(y) for y in x]
    if isinstance(x, tuple):
        return tuple(_concrete_tree(y) for y in x)
    return x


def flat(x) -> list:
    """The leaves of nested lists and tuples, in order."""
    if isinstance(x, (list, tuple)):
        return [z for y in x for z in flat(y)]
    return [x]


def meta_summary(x):
    """Shapes and dtypes of a result (tensors, nested lists of them, other values' types)."""
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.dtype)
    if isinstance(x, (list, tuple)):
        return [meta_summary(y) for y in x]
    return type(x).__name__


def with_grad(args: tuple) -> tuple[tuple, list]:
    """``args`` with every float tensor (also inside lists) a fresh leaf requiring grad,
    and those leaves in order."""
    leaves = []

    def req(x):
        if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
            y = x.detach().requires_grad_()
            leaves.append(y)
            return y
        if isinstance(x, list):
            return [req(y) for y in x]
        return x
    return tuple(req(a) for a in args), leaves


def capture_backward(target, forward, forward_strategy, seed: int = 0):
    """A strategy for ``target`` (a backward op): draw a forward case, run ``forward`` and
    autograd on CPU with a random cotangent, and keep the arguments ``target`` was called
    with."""
    @st.composite
    def draw_case(draw) -> Case:
        from hypothesis import reject
        case = draw(forward_strategy)
        args, kwargs = case.build("cpu")
        args, leaves = with_grad(args)
        if not leaves:
            reject()
        cap = _Capture(target)
        try:
            with cap.mode:
                out = forward(*args, **kwargs)
                outs = [o for o in flat(out) if isinstance(o, torch.Tensor) and o.requires_grad]
                if not outs:
                    reject()
                gen = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
                cots = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) for o in outs]
                torch.autograd.grad(outs, leaves, cots, allow_unused=True)
        except Exception:
            reject()
        if not cap.calls:
            reject()
        a, k = cap.calls[0]
        return Case(_concrete_tree(a), _concrete_tree(k), grad=False)
    return draw_case()


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
