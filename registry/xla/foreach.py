"""``_foreach_*`` lowerings: the elementwise math of unary.py, arithmetic.py, binary.py
and ternary.py mapped over tensor lists.

Only the functional ops are registered; their in-place twins (``_foreach_add_`` ...,
what the optimizers call) are derived by the dispatcher. One jitted call covers the whole
list, so an optimizer step over N parameters is one XLA program per op, not N.
Element ``i`` of a result takes torch's dtype for output ``i``.

Lists of 0-dim tensors (an optimizer's step counters and the bias corrections made from
them) are computed stacked, as one vector: XLA fuses per array, so N counters made N tiny
fusions per op, each run as a loop of its own (XLA:CPU) or a kernel launch (XLA:TPU). The
compiled small-GPT AdamW step had 87 scalar fusions and 29 ``pow`` select reductions
for its 29 counters.
"""
from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import torch

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla import arithmetic, binary, ternary, unary
from tpu_kernels.registry.xla._util import float_compute


def _pick(v: Any, i: int) -> Any:
    """Element ``i`` of a per-tensor argument (a list), or ``v`` (shared by all)."""
    if isinstance(v, (list, tuple)):
        return v[i]
    return v


def _each(core: Callable, *args: Any) -> list[Any]:
    """``[core(*element i of each list argument (others as they are), out_dtype(i))]``; one
    call on the stacked lists where they are all 0-dim arrays (see above)."""
    n = len(next(a for a in args if isinstance(a, (list, tuple))))
    dts = [out_dtype(i) for i in range(n)]
    if n > 1 and all(d == dts[0] for d in dts) and all(_stackable(a) for a in args):
        out = core(*[jnp.stack(a) if isinstance(a, (list, tuple)) else a for a in args], dts[0])
        return [out[i] for i in range(n)]
    return [core(*[_pick(a, i) for a in args], dts[i]) for i in range(n)]


def _stackable(v: Any) -> bool:
    """A list of 0-dim arrays of one dtype, or a number or 0-dim array shared by all."""
    if isinstance(v, (list, tuple)):
        first = v[0]
        return all(getattr(x, "ndim", None) == 0 and x.dtype == first.dtype for x in v)
    return getattr(v, "ndim", 0) == 0


def _overloads(name: str) -> list[str]:
    packet = getattr(torch.ops.aten, name)
    return [f"aten::{name}.{o}" for o in packet.overloads() if "out" not in o.lower()]


# -- unary ----------------------------------------------------------------------------------
_UNARY = ["abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1",
          "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal",
          "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc"]


def _unary(core: Callable) -> Callable:
    def lower(self):
        return _each(core, self)
    return lower


for _name in _UNARY:
    xla(f"aten::_foreach_{_name}", name=f"_foreach_{_name}")(_unary(unary.unary_core(_name)))


# -- binary: Scalar, List, ScalarList and Tensor overloads share one lowering -----------------------
def _binary(core: Callable) -> Callable:
    def lower(self, other, *, alpha=1):
        return _each(lambda x, y, dt: core(x, y, alpha, dt), self, other)
    return lower


def _no_alpha(core: Callable) -> Callable:
    return lambda x, y, alpha, dt: core(x, y, dt)


def _clamp_min(x, lo, dt):
    return ternary.clamp_core(x, lo, None, dt)


def _clamp_max(x, hi, dt):
    return ternary.clamp_core(x, None, hi, dt)


_BINARY: dict[str, Callable] = {
    "add": arithmetic.add_core, "sub": arithmetic.sub_core, "mul": _no_alpha(arithmetic.mul_core),
    "div": _no_alpha(arithmetic.div_core), "pow": _no_alpha(arithmetic.pow_core),
    "maximum": _no_alpha(binary.binary_core("maximum")), "minimum": _no_alpha(binary.binary_core("minimum")),
    # clamp_min/max are max/min with torch's clamp promotion (= the op's result dtype)
    "clamp_min": _no_alpha(_clamp_min), "clamp_max": _no_alpha(_clamp_max),
}

for _name, _core in _BINARY.items():
    _ops = [o for o in _overloads(f"_foreach_{_name}") if not o.endswith("ScalarAndTensor")]
    xla(*_ops, name=f"_foreach_{_name}")(_binary(_core))


@xla("aten::_foreach_pow.ScalarAndTensor")
def _foreach_pow_scalar_and_tensor(self, exponent):
    return _each(arithmetic.pow_core, self, exponent)


# -- ternary ---------------------------------------------------------------------------------------
def _pointwise(core: Callable) -> Callable:
    def lower(self, tensor1, tensor2, scalars=1):
        if getattr(scalars, "ndim", 0) == 1:   # ``.Tensor``: one value per element
            scalars = [scalars[i] for i in range(len(self))]
        return _each(core, self, tensor1, tensor2, scalars)
    return lower


xla(*_overloads("_foreach_addcmul"), name="_foreach_addcmul")(_pointwise(ternary.addcmul_core))
xla(*_overloads("_foreach_addcdiv"), name="_foreach_addcdiv")(_pointwise(ternary.addcdiv_core))


@xla(*_overloads("_foreach_lerp"))
def _foreach_lerp(self, tensors1, weight):
    return _each(ternary.lerp_core, self, tensors1, weight)


# -- reductions, copies ------------------------------------------------------------------------------
def vector_norm(x, ord: float, dt) -> Any:
    """The ``ord``-norm of all of ``x``, computed in float32 for half types."""
    a = jnp.abs(x.astype(float_compute(dt)))
    if ord == float("inf"):
        r = jnp.max(a, initial=0.0)
    elif ord == float("-inf"):
        r = jnp.min(a)
    elif ord == 0:
        r = jnp.sum(a != 0).astype(a.dtype)
    elif ord == 1:
        r = jnp.sum(a)
    elif ord == 2:
        r = jnp.sqrt(jnp.sum(a * a))
    else:
        r = jnp.sum(a ** ord) ** (1.0 / ord)
    return r.astype(dt)


@xla("aten::_foreach_norm.Scalar", static=("ord",))
def _foreach_norm(self, ord=2, dtype=None):  # noqa: A002  (schema name)
    return [vector_norm(x, float(ord), out_dtype(i)) for i, x in enumerate(self)]


@xla("aten::_foreach_powsum.Scalar", static=("ord",))
def _foreach_powsum(self, ord=2, dtype=None):  # noqa: A002
    out = []
    for i, x in enumerate(self):
        a = jnp.abs(x.astype(float_compute(out_dtype(i))))
        out.append(jnp.sum(a != 0) if float(ord) == 0 else jnp.sum(a ** float(ord)))
    return out


@xla("aten::_foreach_max")
def _foreach_max(self):
    return [jnp.max(x) for x in self]


@xla("aten::_foreach_zero")
def _foreach_zero(self):
    return [jnp.zeros_like(x) for x in self]


@xla("aten::_foreach_copy")
def _foreach_copy(self, src, non_blocking=False):
    return [jnp.broadcast_to(s.astype(x.dtype), x.shape) for x, s in zip(self, src)]


@xla("aten::_foreach_clone")
def _foreach_clone(self, *, memory_format=None):
    return list(self)
