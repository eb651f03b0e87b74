"""Helpers shared by the XLA lowerings: torch's type promotion and dtype rules in jax."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tpu_kernels.registry.dtypes import to_jax_dtype, to_torch_dtype


def is_weak(x: Any) -> bool:
    """A Python scalar (traced as a weakly-typed value) rather than a tensor."""
    if isinstance(x, (bool, int, float, complex)):
        return True
    aval = getattr(x, "aval", None)
    return bool(getattr(aval, "weak_type", False))


def _meta_operand(x: Any) -> Any:
    if is_weak(x):
        kind = np.dtype(x.dtype).kind if hasattr(x, "dtype") else type(x).__name__[0]
        return {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1j}.get(kind, 1.0)
    return torch.empty(tuple(x.shape), dtype=to_torch_dtype(x.dtype), device="meta")


def result_type(*xs: Any) -> np.dtype:
    """torch.result_type over jax operands (tensors, 0-d tensors, Python scalars)."""
    ops = [_meta_operand(x) for x in xs if x is not None]
    # torch.result_type is binary: fold dimensioned tensors, then 0-d tensors, then scalars
    tensors = sorted((o for o in ops if isinstance(o, torch.Tensor)), key=lambda t: t.dim() == 0)
    scalars = [o for o in ops if not isinstance(o, torch.Tensor)]
    if tensors:
        acc = tensors[0]
    else:
        acc, scalars = torch.empty((), dtype=_scalar_dtype(scalars[0]), device="meta"), scalars[1:]
    for o in tensors[1:] + scalars:
        acc = torch.empty(acc.shape, dtype=torch.result_type(acc, o), device="meta")
    return to_jax_dtype(acc.dtype)


def _scalar_dtype(s: Any) -> torch.dtype:
    if isinstance(s, bool):
        return torch.bool
    if isinstance(s, int):
        return torch.int64
    if isinstance(s, complex):
        return torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128
    return torch.get_default_dtype()


def as_dtype(x: Any, dtype) -> jax.Array:
    """``x`` (array or Python scalar) as an array of ``dtype``."""
    if not hasattr(x, "astype"):
        return jnp.asarray(x, dtype=dtype)
    y = x.astype(dtype)
    if x.dtype == jnp.bool_ and jnp.issubdtype(dtype, jnp.inexact):
        # XLA:CPU rewrites convert(bool) * y as select(bool, y, 0), losing False * inf = nan
        y = jax.lax.optimization_barrier(y)
    return y


# torch's casts to float8_e4m3fn saturate: a value past the largest finite one (448),
# infinity included, becomes +-448; XLA's cast gives NaN (the type has no infinity)
_SATURATED = {np.dtype(jnp.float8_e4m3fn): 448.0}


def cast(x: jax.Array, dtype: Any) -> jax.Array:
    """``x.astype(dtype)`` with torch's rounding at the edges (see ``_SATURATED``)."""
    dtype = np.dtype(dtype)
    bound = _SATURATED.get(dtype)
    if bound is not None and x.dtype != dtype and jnp.issubdtype(x.dtype, jnp.floating):
        x = jnp.where(jnp.isnan(x), x, jnp.clip(x, -bound, bound))
    return x.astype(dtype)


def compute_dtype(*xs: Any) -> np.dtype:
    """The dtype torch computes a binary op in: the promoted type of its operands."""
    return result_type(*xs)


def float_compute(dtype) -> np.dtype:
    """Low-precision floats compute in float32 (as torch's CPU kernels do)."""
    dtype = np.dtype(dtype)
    return np.dtype(jnp.float32) if dtype in (jnp.bfloat16, jnp.float16) else dtype


_PRECISION = {"highest": jax.lax.Precision.HIGHEST, "high": jax.lax.Precision.HIGH,
              "medium": jax.lax.Precision.DEFAULT}


def matmul_precision() -> jax.lax.Precision:
    """``torch.get_float32_matmul_precision()`` as a jax precision, read at trace time (the
    setting is part of the dispatch cache key, so changing it retraces)."""
    return _PRECISION[torch.get_float32_matmul_precision()]


_META_LIB = torch.library.Library("aten", "IMPL")


def meta_like(op_name: str, like: str) -> None:
    """Give an ATen op that torch ships without a Meta kernel one whose result is shaped
    like its argument ``like`` (the dispatcher asks the meta function for every result)."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op_name}", "Meta"):
        return
    name, _, overload = op_name.partition(".")
    op = getattr(getattr(torch.ops.aten, name), overload or "default")
    pos = [a.name for a in op._schema.arguments].index(like)
    _META_LIB.impl(op_name, lambda *args, **kw: torch.empty_like(args[pos]), "Meta")


def meta_nothing(op_name: str) -> None:
    """Give an in-place ATen op that returns nothing, shipped without a Meta kernel (the
    fused SGD and Adagrad steps), one that does nothing: its results are its arguments."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op_name}", "Meta"):
        _META_LIB.impl(op_name, lambda *args, **kw: None, "Meta")


def is_int(dt) -> bool:
    """An integer or bool dtype."""
    return jnp.issubdtype(dt, jnp.integer) or np.dtype(dt) == np.bool_


def is_bool(dt) -> bool:
    return np.dtype(dt) == np.bool_
