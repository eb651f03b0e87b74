"""Op names: the one parser from a name to an ``OpOverload`` (or a higher-order op:
``"higher_order::flex_attention"``), and the naming rules the route relies on (the
in-place twin of ``add_`` is ``add``)."""
from __future__ import annotations

from typing import Any

import torch
from torch._ops import HigherOrderOperator, OpOverload


def lookup_op(name: str | Any) -> Any:
    """``"aten::add.Tensor"``, ``"aten.add.Tensor"``, ``"aten::add"``, an OpOverload(Packet)
    or a higher-order op (``"higher_order::flex_attention"``, or the op itself)."""
    if not isinstance(name, str):
        return name
    ns, _, rest = name.replace("::", ".").partition(".")
    base, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), base)
    except (AttributeError, RuntimeError) as exc:
        raise ValueError(f"unknown op {name!r}: torch.ops.{ns}.{base} does not exist") from exc
    if not overload:
        return packet
    try:
        return getattr(packet, overload)
    except AttributeError as exc:
        raise ValueError(f"unknown overload {name!r}; {ns}::{base} has {packet.overloads()}") from exc


def resolve_overload(name: Any) -> Any:
    """An OpOverload from a name; a bare packet means its ``.default`` overload."""
    op = lookup_op(name)
    if hasattr(op, "overloads"):  # a packet
        if "default" in op.overloads():
            return op.default
        raise ValueError(
            f"op {name!r} has several overloads {op.overloads()}; name one, e.g. "
            f"\"{name}.{op.overloads()[0]}\"")
    return op


def overload_or_none(name: str) -> OpOverload | None:
    """The overload ``name`` names, or None when this torch build has no such overload."""
    try:
        op = lookup_op(name)
    except ValueError:
        return None
    return op if isinstance(op, OpOverload) else None


def is_hop(op: Any) -> bool:
    """``op`` is a higher-order op (``torch.ops.higher_order.*``: its arguments include
    callables; no schema, no in-place twin, no decomposition)."""
    return isinstance(op, HigherOrderOperator)


def op_name(op: Any) -> str:
    """The registry spelling: ``aten::add.Tensor``, ``higher_order::flex_attention``."""
    if is_hop(op):
        return f"{op.namespace}::{op.name()}"
    return f"{op._schema.name}.{op._overloadname}"


def namespace(op: OpOverload) -> str:
    return op._schema.name.split("::")[0]


def base_name(op: OpOverload) -> str:
    """The packet's name without its namespace: ``add_`` for ``aten::add_.Tensor``."""
    return op._schema.name.split("::")[1]


def functional_twin(op: OpOverload) -> OpOverload | None:
    """``aten::add`` for ``aten::add_`` (same overload), ``_foreach_add`` for
    ``_foreach_add_``; None when ``op`` is not in place or has no twin. The twin takes
    the same argument types: the same overload when it does, else the overload that does
    (``pow_.Scalar(Tensor self, Scalar exponent)`` is ``pow.Tensor_Scalar``'s in-place
    form; ``pow.Scalar`` takes a Scalar base)."""
    name = base_name(op)
    if not name.endswith("_") or name.startswith("__"):
        return None
    packet = getattr(getattr(torch.ops, namespace(op)), name[:-1], None)
    if packet is None:
        return None
    want = _arg_types(op)
    same = getattr(packet, op._overloadname, None)
    if same is not None and _arg_types(same) == want:
        return same
    return next((o for o in overloads(packet) if _arg_types(o) == want), same)


def overloads(packet: Any) -> list[OpOverload]:
    """Every overload of an op packet, as ``getattr`` gives it: the registry's keys
    (``packet.__getattr__`` would build new, unequal objects)."""
    return [getattr(packet, n) for n in packet.overloads()]


def _arg_types(op: OpOverload) -> tuple:
    return tuple(str(a.type) for a in op._schema.arguments)
