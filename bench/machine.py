"""The machine a benchmark ran on, recorded beside its figures, so that a comparison with
a run from another machine says so instead of reporting the machines' difference as a
slowdown (a ratio of XLA's CPU code to torch's, ``jit/cpu`` in ``dispatch.py``, moved
1.4 -> 2.3 between two of this project's 2-core machines with no code change)."""
from __future__ import annotations

import os
import platform
from typing import Any

import jax
import torch

FIELDS = ("cpu", "cores", "backend")     # what must match for ratios to compare


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> dict[str, Any]:
    """CPU model, core count, JAX's backend and the versions that shape the figures."""
    return {"host": platform.node(), "cpu": _cpu_model(), "cores": os.cpu_count(),
            "backend": jax.default_backend(), "python": platform.python_version(),
            "torch": torch.__version__, "jax": jax.__version__}


def mismatch(new: dict[str, Any], old: dict[str, Any]) -> str | None:
    """A note when the run ``old`` may come from another machine than the run ``new``
    (each a results dict holding ``describe()``'s keys; an older file may lack them);
    None when they match."""
    if not any(k in old for k in FIELDS):
        return ("note: the earlier run records no machine; if it ran elsewhere, the comparison "
                "measures the machines as well")
    diff = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in FIELDS if old.get(k) != new.get(k)]
    if not diff:
        return None
    return ("note: the earlier run was on another machine (" + "; ".join(diff) + "): the comparison "
            "measures the machines as well; compare runs from one machine")
