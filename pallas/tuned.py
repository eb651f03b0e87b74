"""Tuned block sizes as data: one JSON table per kernel, keyed by chip and shape class.

``tuned/<kernel>.json`` (shipped with the package) holds, per ``"<chip>|<shape class>"``,
the parameters ``python -m tpu_kernels tune KERNEL --chip ... --write`` chose (on a TPU
by timing; without one by real-compile success, the compiled VMEM and the cost model)
and the figures behind the choice. A kernel's block heuristic asks first:

    hit = tuned.lookup_blocks("matmul", chip, dtype, m=m, n=n, k=k)
    bm, bn, bk = hit or <heuristic>

A shape class is the dtype and each named dim rounded up to a power of two: every
problem in a class is at most the size the entry was tuned at, so the tuned blocks,
fitted to the problem (``fit``: same block count, least padding), never outgrow the
VMEM they were checked against. No entry: None, and the
heuristic decides.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
from typing import Any, Iterator

import jax.numpy as jnp

from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.launch import max_vmem_bytes

DIR = os.path.join(os.path.dirname(__file__), "tuned")
VERSION = 1


def bucket(d: int) -> int:
    """A dim's class: the next power of two (0 and 1 stay themselves)."""
    d = int(d)
    return d if d <= 1 else 1 << (d - 1).bit_length()


def shape_class(dtype: Any, **dims: int) -> str:
    """``"bfloat16 m=1024 n=4096 k=4096"``: the dtype and each dim's power-of-two bucket,
    in the order given (the kernel's own order: callers name the same dims each time)."""
    name = jnp.dtype(dtype).name
    return " ".join([name] + [f"{k}={bucket(v)}" for k, v in dims.items()])


def representative(shape_cls: str) -> tuple[str, dict[str, int]]:
    """The dtype and the dims a class is tuned at (its buckets): the inverse of ``shape_class``."""
    dtype, *parts = shape_cls.split()
    return dtype, {k: int(v) for k, v in (p.split("=") for p in parts)}


def key(chip: str | tpu_info.Chip, shape_cls: str) -> str:
    return f"{tpu_info.chip(chip).name}|{shape_cls}"


def path(kernel: str) -> str:
    return os.path.join(DIR, f"{kernel.replace(':', '_')}.json")


@functools.cache
def table(kernel: str) -> dict[str, Any]:
    """The kernel's shipped table (``{"params": [...], "entries": {...}}``; empty when none)."""
    p = path(kernel)
    if not os.path.exists(p):
        return {"kernel": kernel, "version": VERSION, "params": [], "entries": {}}
    with open(p) as f:
        return json.load(f)


_OFF: contextvars.ContextVar[bool] = contextvars.ContextVar("tpu_kernels_tuned_off", default=False)


@contextlib.contextmanager
def heuristics_only() -> Iterator[None]:
    """Within the block every lookup misses: the kernels' heuristics decide (what the
    tuner compares its choice with)."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


_FORCED: contextvars.ContextVar[dict[str, dict]] = contextvars.ContextVar("tpu_kernels_tuned_forced", default={})


@contextlib.contextmanager
def forced(kernel: str, entry: dict) -> Iterator[None]:
    """Within the block every lookup for ``kernel`` answers ``entry`` (parameters by name):
    how the tuner tries a configuration on a kernel that takes no block argument."""
    token = _FORCED.set({**_FORCED.get(), kernel: entry})
    try:
        yield
    finally:
        _FORCED.reset(token)


def lookup(kernel: str, chip: str | tpu_info.Chip, shape_cls: str) -> dict | None:
    """The tuned entry for (kernel, chip, shape class): its parameters by name plus the
    figures behind them; None when the table has none (use the heuristic)."""
    if kernel in _FORCED.get():
        return _FORCED.get()[kernel]
    if _OFF.get():
        return None
    return table(kernel)["entries"].get(key(chip, shape_cls))


def params(kernel: str, chip: str | tpu_info.Chip, shape_cls: str) -> tuple[int, ...] | None:
    """The tuned parameters in the table's order (``("bm", "bn", "bk")`` for matmul)."""
    entry = lookup(kernel, chip, shape_cls)
    if entry is None:
        return None
    names = table(kernel)["params"] or list(entry)    # a forced entry names its own
    return tuple(int(entry[p]) for p in names)


def fit(block: int, dim: int, align: int) -> int:
    """``block`` fitted to ``dim``: as many blocks as ``block`` needs over ``dim`` padded
    to ``align``, each as small as that count allows (a multiple of ``align``). Never
    larger than ``block``; pads the dim by less than one ``align`` per block (m=520 with
    a 512-row block: two blocks of 272, not two of 512)."""
    padded = tpu_info.round_up(dim, align)
    count = -(-padded // block)
    return tpu_info.round_up(-(-padded // count), align)


def lookup_blocks(kernel: str, chip: str | tpu_info.Chip, dtype: Any, align: tuple[int, ...] = (),
                  **dims: int) -> tuple[int, ...] | None:
    """``params`` for the class of this problem: the one call a ``choose_blocks`` makes.
    With ``align``, the first ``len(align)`` parameters are ``fit`` to the first dims
    (matmul: bm, bn, bk to m, n, k with (sublane, 128, 128))."""
    found = params(kernel, chip, shape_class(dtype, **dims))
    if found is None or not align:
        return found
    sizes = list(dims.values())
    return tuple(fit(b, sizes[i], align[i]) if i < len(align) else b for i, b in enumerate(found))


def vmem_budget(chip: tpu_info.Chip, tuned_hit: Any) -> int:
    """VMEM a kernel's blocks may take: the default share of the scoped limit, or, for
    tuned blocks (compiled and checked for this chip), the most for which
    ``launch.vmem_limit`` (estimate x headroom, at most 3/4 of VMEM) can raise the limit."""
    if tuned_hit:
        return max_vmem_bytes(tpu_info.chip(chip))
    return tpu_info.vmem_budget(chip)


def helion_config(kernel: str, chip: str | tpu_info.Chip, dtype: Any, shape: tuple[int, ...]) -> dict | None:
    """A Helion kernel's fixed config from its table (``helion_<kernel>.json``), keyed by
    the first array's shape (dims ``d0, d1, ...``); None: the kernel's own rule."""
    entry = lookup(f"helion_{kernel}", chip, shape_class(dtype, **{f"d{i}": s for i, s in enumerate(shape)}))
    return None if entry is None else dict(entry["config"])


def write(kernel: str, param_names: list[str], entries: dict[str, dict]) -> str:
    """Merge ``entries`` into the kernel's table file; returns its path."""
    old = table(kernel)
    merged = {**old.get("entries", {}), **entries}
    os.makedirs(DIR, exist_ok=True)
    with open(path(kernel), "w") as f:
        json.dump({"kernel": kernel, "version": VERSION, "params": list(param_names),
                   "entries": dict(sorted(merged.items()))}, f, indent=1)
        f.write("\n")
    table.cache_clear()
    return path(kernel)
