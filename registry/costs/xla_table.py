"""XLA's estimated time for an op's fallback, from the real TPU compiler, as shipped data.

``xla_estimates.json`` holds, per (op, chip, shape class), the compiled XLA program's
``cost_analysis()['optimal_seconds']`` (libtpu compile-only, ``tpu_kernels.aot``) at one
representative shape of the class, with that shape's *ideal* time (``ideal_seconds``: its
flops at peak or its inputs and outputs moved once, whichever is longer; cheap, no
compiler). A call is estimated as

    exact shape in the table:   its compiled seconds
    same shape class:           compiled seconds x ideal(call) / ideal(entry)
    no entry:                   ideal(call) / XLA's median efficiency (ideal / compiled) on the chip

Regenerate with ``python -m tpu_kernels costs --write`` (about a second or more per compile).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
from typing import Any, Callable

import jax
import torch
from torch.utils._pytree import tree_leaves

from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry.costs import shipped

PATH = os.path.join(os.path.dirname(__file__), "xla_estimates.json")


def _bucket(d: int) -> int:
    """A dim's shape class: the next power of two (0 and 1 stay themselves)."""
    return d if d <= 1 else 1 << (int(d) - 1).bit_length()


def _leaf_sig(x: Any, bucket: bool) -> str:
    if isinstance(x, torch.Tensor):
        dims = [_bucket(d) if bucket else int(d) for d in x.shape]
        return f"{str(x.dtype).replace('torch.', '')}[{','.join(map(str, dims))}]"
    if isinstance(x, bool) or x is None or isinstance(x, (str, torch.dtype)):
        return str(x)
    if isinstance(x, int):
        return "int"        # sizes given as ints (num_weights, k) follow the tensors' class
    return type(x).__name__  # floats (eps, lr) never change the cost


def signature(args: tuple, kwargs: dict, *, bucket: bool) -> str:
    """The arguments' shape class (``bucket=True``) or exact shapes, as a table key part."""
    leaves = tree_leaves((args, sorted(kwargs.items())))
    return " ".join(_leaf_sig(x, bucket) for x in leaves)


def key(op_name: str, chip: str, args: tuple, kwargs: dict) -> str:
    return f"{op_name}|{chip}|{signature(args, kwargs, bucket=True)}"


def ideal_seconds(fn: Callable[..., Any], specs: list, chip: str) -> float:
    """The op's roofline time on ``chip``: its flops (from the lowered, unoptimised
    program: a dot's flops do not depend on fusion) at peak, or reading its inputs and
    writing its outputs once at full HBM bandwidth, whichever is longer."""
    row = tpu_info.chip(chip)
    cost = jax.jit(fn).lower(*specs).cost_analysis() or {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    flops = float(cost.get("flops", 0.0) or 0.0)
    outs = jax.tree_util.tree_leaves(jax.eval_shape(fn, *specs))
    moved = sum(math.prod(a.shape) * a.dtype.itemsize for a in (*specs, *outs))
    return max(flops / row.bf16_flops, moved / row.hbm_bytes_per_s)


@dataclasses.dataclass(frozen=True)
class Estimate:
    seconds: float
    source: str        # "compiled" | "class" | "fallback"


@functools.cache
def table() -> dict[str, dict]:
    """The shipped table (empty when the file is missing)."""
    return shipped.read(PATH)


def estimate(op_name: str, chip: str, args: tuple, kwargs: dict, roofline: float) -> Estimate:
    """XLA's time for ``op_name`` on these arguments (``roofline``: their ideal seconds)."""
    entries = table()
    entry = entries.get(key(op_name, chip, args, kwargs))
    if entry is not None:
        if entry["shapes"] == signature(args, kwargs, bucket=False):
            return Estimate(entry["seconds"], "compiled")
        if entry["roofline"] > 0:
            return Estimate(entry["seconds"] * roofline / entry["roofline"], "class")
    return Estimate(roofline / _efficiency(op_name, chip), "fallback")


@functools.cache
def _efficiency(op_name: str, chip: str) -> float:
    """XLA's median (ideal / compiled seconds) for the op on the chip, else for
    the chip, else 1."""
    def eff(pred: Callable[[str], bool]) -> list[float]:
        return [e["roofline"] / e["seconds"] for k, e in table().items()
                if pred(k) and e["seconds"] > 0 and e["roofline"] > 0]
    for pred in (lambda k: k.startswith(f"{op_name}|{chip}|"), lambda k: f"|{chip}|" in k):
        found = eff(pred)
        if found:
            return max(statistics.median(found), 1e-3)
    return 1.0


def write(entries: dict[str, dict]) -> None:
    """Merge ``entries`` into the shipped table."""
    shipped.merge(PATH, entries)
    table.cache_clear()
    _efficiency.cache_clear()

