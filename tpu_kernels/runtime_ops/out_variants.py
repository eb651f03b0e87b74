"""``out=`` overloads (``torch.add(a, b, out=c)``, ``F.normalize(v, out=v)``) on tpu tensors.

One rule runs every ``out`` overload whose op has a functional overload taking the same
arguments (``aten::div.out`` -> ``aten::div.Tensor``, ``sum.IntList_out`` ->
``sum.dim_IntList``, ``max.dim_max`` -> ``max.dim``), as torch's own out wrappers do:

1. the functional overload runs on the call's arguments (dispatched as usual, so the
   registry's impl of the functional op runs); a functional op with a ``dtype`` argument
   the call left unset computes in ``out``'s dtype, as torch's reductions do, and a
   factory (``zeros.out`` -> ``zeros``) makes its result on ``out``'s device;
2. each result must cast to its ``out`` (torch: "result type Float can't be cast to the
   desired output type Long");
3. an ``out`` of another shape is resized, with torch's deprecation warning when it held
   elements;
4. the values are copied in, and the op returns its ``out`` tensors (as its schema says).

An ``out`` overload with an impl of its own in the registry takes that impl instead;
CompositeImplicitAutograd ones decompose above the device, as in plain eager.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch._ops import OpOverload

from tpu_kernels.dispatch.overlap import check_written, unchecked
from tpu_kernels.registry import REGISTRY, register_runtime_rule
from tpu_kernels.registry.dtypes import cast_error
from tpu_kernels.registry.opnames import base_name, namespace, overloads
from tpu_kernels.registry.route import composite_implicit

OUT_RULE = "out"   # the rule's name (registry.impls and the coverage report show it)


def _out_names(op: OpOverload) -> tuple[str, ...]:
    """The names of ``op``'s ``out`` arguments (keyword-only, written), in schema order."""
    return tuple(a.name for a in op._schema.arguments
                 if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)


def _signature(args: list) -> tuple:
    return tuple((a.name, str(a.type)) for a in args)


@functools.cache
def functional_of(op: OpOverload) -> OpOverload | None:
    """The functional overload taking ``op``'s arguments but its ``out`` ones, when ``op``
    is an ``out`` overload (only its ``out`` arguments written) and there is one; else None."""
    schema = op._schema
    outs = _out_names(op)
    if not outs or any(a.alias_info is not None and a.alias_info.is_write and a.name not in outs
                       for a in schema.arguments):
        return None
    packet = getattr(getattr(torch.ops, namespace(op)), base_name(op))
    candidates = [o for o in overloads(packet) if not o._schema.is_mutable]
    args = [a for a in schema.arguments if a.name not in outs]
    for same in (_signature, _without_options):   # the same arguments, else but options
        want = same(args)
        for other in candidates:
            if same(other._schema.arguments) == want:
                return other
    return None


def _without_options(args: list) -> tuple:
    """``_signature`` of ``args`` but a factory's tensor options (``zeros(size, *, dtype,
    layout, device, pin_memory)`` is ``zeros.out(size, *, out)``'s functional overload)."""
    return _signature([a for a in args if not (a.kwarg_only and a.name in _OPTIONS)])


_OPTIONS = ("dtype", "layout", "device", "pin_memory")


def _applies(op: OpOverload) -> bool:
    return (functional_of(op) is not None and not REGISTRY.has(op)
            and not composite_implicit(op))


def run_out_variant(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """The rule's handler (see the module docstring)."""
    functional = functional_of(op)
    names = _out_names(op)
    outs = [kwargs[n] for n in names]
    fkwargs = {k: v for k, v in kwargs.items() if k not in names}
    takes = {a.name for a in functional._schema.arguments}
    first = outs[0] if isinstance(outs[0], torch.Tensor) else None   # else a list (``Tensor(a!)[] out``)
    if (first is not None and len(outs) == 1 and fkwargs.get("dtype") is None and "dtype" in takes
            and not _complex_into_real(args, first)):
        fkwargs["dtype"] = first.dtype
    if first is not None and "device" in takes:   # a factory makes its result where ``out`` is
        fkwargs["device"] = first.device
    for out in outs:   # torch's overlap checks of ``op``, before anything runs
        check_written(op, out, args, kwargs)
    result = functional(*args, **fkwargs)
    with unchecked():
        for out, value in zip(outs, (result,) if len(outs) == 1 else result):
            if isinstance(out, torch.Tensor):
                _write(op, out, value)
            else:
                for o, v in zip(out, value, strict=True):
                    _write(op, o, v)
    if not op._schema.returns:   # (a list ``out``'s overload returns nothing)
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


def _complex_into_real(args: tuple, out: torch.Tensor) -> bool:
    """A complex input with a real ``out`` (``linalg.vector_norm``): its ``dtype`` argument
    names a complex type, so ``out``'s is not passed on."""
    return not out.is_complex() and any(isinstance(a, torch.Tensor) and a.is_complex() for a in args)


def _write(op: OpOverload, out: torch.Tensor, value: torch.Tensor) -> None:
    if not torch.can_cast(value.dtype, out.dtype):
        raise cast_error(value.dtype, out.dtype)
    if out.shape != value.shape:
        if out.numel():
            warnings.warn(
                f"An output with one or more elements was resized since it had shape {list(out.shape)}, "
                f"which does not match the required output shape {list(value.shape)}. This behavior "
                "is deprecated, and in a future PyTorch release outputs will not be resized unless "
                "they have zero elements. You can explicitly reuse an out tensor t by resizing it, "
                "inplace, to zero elements with t.resize_(0).", UserWarning, stacklevel=2)
        out.resize_(value.shape)
    out.copy_(value)


register_runtime_rule(OUT_RULE, _applies, run_out_variant)
