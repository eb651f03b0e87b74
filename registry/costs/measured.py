"""Kernel and XLA times measured on a chip, as shipped data: the evidence the model defers to.

``measured.json`` holds, per (op, kernel impl, chip, exact argument shapes), the device
time of the kernel impl's program and of the op's XLA lowering, each run on its own
(``python -m tpu_kernels.bench.kernel_choice --write`` on a TPU). ``decide`` asks
``lookup`` before its model: a call measured at its exact shapes takes the measured
times; a call of the same shape class (dims rounded up to powers of two, as
``xla_table``) takes the measured pair scaled by the ratio of the two calls' ideal times,
so the measured ratio decides. Anything else is left to the model. Calls are keyed by
their arguments bound to the op's schema (defaults filled in), so ``is_causal=True`` given by
name or by position is one call.
"""
from __future__ import annotations

import functools
import os
from typing import Any

from tpu_kernels.registry.costs import shipped, xla_table

PATH = os.path.join(os.path.dirname(__file__), "measured.json")


def bound(op: Any, args: tuple, kwargs: dict) -> tuple:
    """A call's arguments in schema order, each given or its default (a higher-order op,
    which has no schema, as given)."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return (*args, *sorted(kwargs.items()))
    out = []
    for i, a in enumerate(schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out.append(args[i])
        elif a.name in kwargs:
            out.append(kwargs[a.name])
        else:
            out.append(a.default_value if a.has_default_value() else None)
    return tuple(out)


def signature(op: Any, args: tuple, kwargs: dict, bucket: bool = False) -> str:
    """A call's exact shapes (or, ``bucket``, its shape class), as the table keys them."""
    return xla_table.signature(bound(op, args, kwargs), {}, bucket=bucket)


def _key(op_name: str, impl: str, chip: str, shape_sig: str) -> str:
    return f"{op_name}|{impl}|{chip}|{shape_sig}"


@functools.cache
def table() -> dict[str, dict]:
    """The shipped table (empty when the file is missing)."""
    return shipped.read(PATH)


@functools.cache
def _by_class() -> dict[str, dict]:
    """The table's entries keyed by shape class (the first entry of a class wins)."""
    found: dict[str, dict] = {}
    for entry in table().values():
        found.setdefault(_key(entry["op"], entry["impl"], entry["chip"], entry["class"]), entry)
    return found


def lookup(op: Any, impl: str, chip: str, args: tuple, kwargs: dict,
           ideal: float | None) -> tuple[float, float, str] | None:
    """(kernel seconds, XLA seconds, "measured" | "measured class") for a call of ``op``,
    or None where nothing of its shape class was measured. ``ideal``: the call's ideal
    seconds (None where unknown: a class's pair is then given as measured, unscaled)."""
    exact = table().get(_key(op.name(), impl, chip, signature(op, args, kwargs)))
    if exact is not None:
        return exact["kernel_s"], exact["xla_s"], "measured"
    near = _by_class().get(_key(op.name(), impl, chip, signature(op, args, kwargs, bucket=True)))
    if near is None:
        return None
    scale = ideal / near["ideal_s"] if ideal and near["ideal_s"] > 0 else 1.0
    return near["kernel_s"] * scale, near["xla_s"] * scale, "measured class"


def entry(row: dict[str, Any], op: Any, args: tuple, kwargs: dict, ideal: float) -> tuple[str, dict]:
    """A bench row (``bench/kernel_choice.py``) for a call of ``op`` as a table key and entry."""
    sig = signature(op, args, kwargs)
    return _key(row["op"], row["impl"], row["chip"], sig), {
        "op": row["op"], "impl": row["impl"], "chip": row["chip"], "shapes": sig,
        "class": signature(op, args, kwargs, bucket=True),
        "kernel_s": row["kernel_s"], "xla_s": row["xla_s"], "ideal_s": ideal}


def write(entries: dict[str, dict]) -> None:
    """Merge ``entries`` into the shipped table."""
    shipped.merge(PATH, entries)
    table.cache_clear()
    _by_class.cache_clear()
