"""Kernel and XLA times measured on a chip, as shipped data: the evidence the model defers to.

``measured.json`` holds, per (op, kernel impl, chip, exact argument shapes), the device
time of the kernel impl's program and of the op's XLA lowering, each run on its own
(``python -m tpu_kernels.bench.kernel_choice --write`` on a TPU). ``decide`` asks
``lookup`` before its model: a call measured at its exact shapes takes the measured
times; a call of the same shape class (dims rounded up to powers of two, as
``xla_table``) takes the measured pair scaled by the ratio of the two calls' ideal times,
so the measured ratio decides. Anything else is left to the model.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any

from tpu_kernels.registry.costs import xla_table

PATH = os.path.join(os.path.dirname(__file__), "measured.json")


def signature(args: tuple, kwargs: dict) -> str:
    """The exact shapes of a call, as the table keys them."""
    return xla_table.signature(args, kwargs, bucket=False)


def _key(op_name: str, impl: str, chip: str, shape_sig: str) -> str:
    return f"{op_name}|{impl}|{chip}|{shape_sig}"


@functools.cache
def table() -> dict[str, dict]:
    """The shipped table (empty when the file is missing)."""
    if not os.path.exists(PATH):
        return {}
    with open(PATH) as f:
        return json.load(f)["entries"]


@functools.cache
def _by_class() -> dict[str, dict]:
    """The table's entries keyed by shape class (the first entry of a class wins)."""
    found: dict[str, dict] = {}
    for entry in table().values():
        found.setdefault(_key(entry["op"], entry["impl"], entry["chip"], entry["class"]), entry)
    return found


def lookup(op_name: str, impl: str, chip: str, args: tuple, kwargs: dict,
           ideal: float) -> tuple[float, float, str] | None:
    """(kernel seconds, XLA seconds, "measured" | "measured class") for a call, or None
    where nothing of its shape class was measured. ``ideal``: the call's ideal seconds."""
    exact = table().get(_key(op_name, impl, chip, signature(args, kwargs)))
    if exact is not None:
        return exact["kernel_s"], exact["xla_s"], "measured"
    near = _by_class().get(_key(op_name, impl, chip, xla_table.signature(args, kwargs, bucket=True)))
    if near is None or near["ideal_s"] <= 0:
        return None
    scale = ideal / near["ideal_s"]
    return near["kernel_s"] * scale, near["xla_s"] * scale, "measured class"


def entry(row: dict[str, Any], args: tuple, kwargs: dict, ideal: float) -> tuple[str, dict]:
    """A bench row (``bench/kernel_choice.py``) as a table key and entry."""
    sig = signature(args, kwargs)
    return _key(row["op"], row["impl"], row["chip"], sig), {
        "op": row["op"], "impl": row["impl"], "chip": row["chip"], "shapes": sig,
        "class": xla_table.signature(args, kwargs, bucket=True),
        "kernel_s": row["kernel_s"], "xla_s": row["xla_s"], "ideal_s": ideal}


def write(entries: dict[str, dict]) -> None:
    """Merge ``entries`` into the shipped table."""
    merged = {**table(), **entries}
    with open(PATH, "w") as f:
        json.dump({"version": 1, "entries": dict(sorted(merged.items()))}, f, indent=1)
        f.write("\n")
    table.cache_clear()
    _by_class.cache_clear()
