"""Recipes and cases: ``Spec`` tensors, ``Case`` calls, shapes, dtypes and scalars, the
profiles' size caps."""
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


class FromSpec:
    """A value built from a ``Spec`` (the subclass's ``build`` says how), with its dtype and shape."""
    spec: Spec

    @property
    def dtype(self):
        return self.spec.dtype

    @property
    def shape(self):
        return self.spec.shape


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
