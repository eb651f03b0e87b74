"""A typical input for an op, built from its schema and validated by torch's meta kernel
(the report's "input" column), and the impl the route picks for it."""
from __future__ import annotations

from typing import Any

import torch

from tpu_kernels.registry import REGISTRY, route

_INDEX_NAMES = ("index", "indices", "target", "idx", "offsets", "group_sizes", "counts")


def _tensor(shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


def _value(arg: Any, variant: int) -> tuple[bool, Any]:
    """(ok, value) for a required schema argument; variant 0: (8, 128) float32 tensors,
    1: index-like tensors int64 (8,), 2: square (8, 8), 3: batched (2, 8, 8), 4: (2, 4, 8, 8) images."""
    t, name = str(arg.type), arg.name
    shape = {0: (8, 128), 1: (8, 128), 2: (8, 8), 3: (2, 8, 8), 4: (2, 4, 8, 8)}[variant]
    is_index = any(n in name for n in _INDEX_NAMES)
    if t == "Tensor":
        if variant == 1 and is_index:
            return True, _tensor((8,), torch.int64)
        return True, _tensor(shape)
    if t == "List[Tensor]":
        return True, [_tensor(shape), _tensor(shape)]
    if t == "List[Optional[Tensor]]":
        return True, [_tensor((8,), torch.int64)]
    if t in ("int", "SymInt"):
        return True, (-1 if "dim" in name else 1)
    if t in ("List[int]", "List[SymInt]"):
        if name in ("size", "shape", "sizes"):
            return True, list(shape)
        if name == "stride":
            return True, [128, 1] if len(shape) == 2 else [1] * len(shape)
        if "dim" in name:
            return True, [-1]
        return True, [1]
    if t == "float":
        return True, 0.5
    if t == "bool":
        return True, False
    if t in ("number", "Scalar"):
        return True, 2
    if t == "ScalarType":
        return True, torch.float32
    return False, None


def typical_input(op: Any) -> tuple[tuple, dict, str] | None:
    """Meta-tensor arguments that torch's meta kernel accepts for ``op``, or None."""
    schema = op._schema
    for variant in range(5):
        args, kwargs, ok = [], {}, True
        positional = True
        for a in schema.arguments:
            optional = a.has_default_value() or str(a.type).startswith("Optional[")
            if optional:
                positional = False
                continue
            good, v = _value(a, variant)
            if not good:
                ok = False
                break
            if a.kwarg_only or not positional:
                kwargs[a.name] = v
            else:
                args.append(v)
        if not ok:
            continue
        try:
            with torch.no_grad():
                op(*args, **kwargs)
        except Exception:  # noqa: BLE001  (the meta kernel refuses: try the next variant)
            continue
        return tuple(args), kwargs, _describe(args, kwargs)
    return None


def _describe(args, kwargs) -> str:
    def d(v):
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(d(x) for x in v) + "]"
        return repr(v)
    return ", ".join([d(a) for a in args] + [f"{k}={d(v)}" for k, v in kwargs.items()])


def pick(op: Any, inp: tuple[tuple, dict, str] | None, on_tpu: bool = False) -> str:
    """``kind:name`` of the impl the route picks for ``inp`` (this machine, or as on a TPU);
    an in-place op running its functional twin's impl says so."""
    if inp is None:
        return "n/a"
    args, kwargs, _ = inp
    try:
        if on_tpu:
            with REGISTRY.interpret(True):   # kernels enabled: their supports() decide
                r = route(op, args, kwargs)
        else:
            r = route(op, args, kwargs)
    except Exception as exc:  # noqa: BLE001
        return f"n/a ({type(exc).__name__})"
    if r.impl is None:
        return "-"
    return f"{r.impl.kind}:{r.impl.name}" + (" (in place)" if r.kind == "twin" else "")
