"""An optimizer's step counters, incremented inside its fused step's program.

torch's fused Adam and AdamW run two ops a step: ``_foreach_add_(state_steps, 1)``, then
``_fused_adamw_(..., state_steps, ...)``. Run as an op of its own the increment is a
program with an output per parameter (29 for the small GPT: ~440 µs of host time on a TPU
v5e host, ``bench/results/tpu_v5e/2026-12-04-s24.md``'s ``each 0-dim 32->32``).

So an increment of counters a fused step program has read before (``remember``) is left
pending: each counter's storage holds a placeholder (``lazy.Lazy``) for its new value.
The fused step that follows takes the pending increment into its own program
(``take``: the counters' old values go back into their storages, and the program adds and
writes them, packed with the moments on a TPU). Anything else that reads a counter first
(``state_dict()``, ``print(state["step"])``, a GradScaler's skipped-step fix-up) runs the
increment then (``fill``), so every read sees torch's value.
"""
from __future__ import annotations

import sys
import weakref
from typing import Any

import jax
import torch
from torch._ops import OpOverload

from tpu_kernels import devices, lazy
from tpu_kernels.dispatch import graph_trace, run_call
from tpu_kernels.lazy import Lazy, concrete
from tpu_kernels.registry import runtime_handler
from tpu_kernels.storage import Storage
from tpu_kernels.tensor import TpuTensor

_COUNTERS: "weakref.WeakSet[Storage]" = weakref.WeakSet()   # storages a fused step read as counters
_add = jax.jit(lambda values, alpha: [v + alpha for v in values])


class PendingAdd:
    """``_foreach_add_(counters, alpha)`` not run yet. It is the ``program`` of the
    placeholders it left in the counters' storages (``lazy.concrete`` calls ``fill``)."""

    def __init__(self, storages: list[Storage], alpha: int | float) -> None:
        self.storages, self.alpha = storages, alpha
        self.olds: list | None = [st.array for st in storages]   # (concrete or placeholders)
        self.index = storages[0].index
        self.members = [Lazy(jax.ShapeDtypeStruct(tuple(o.shape), o.dtype), self, k)
                        for k, o in enumerate(self.olds)]
        for st, lz in zip(storages, self.members):
            st.array, st.version = lz, st.version + 1

    def fill(self, placeholder: Lazy) -> None:
        """Run the increment: every placeholder of it gets its value."""
        olds, self.olds = self.olds, None
        if olds is None:
            raise RuntimeError("internal: a step counter's pending increment was read after a "
                               "fused optimizer step took it")
        news = _add([concrete(o) for o in olds], self.alpha)
        for lz, v in zip(self.members, news):
            lz.value, lz.program = v, None

    def take(self) -> None:
        """Give the increment to the fused step about to run: the counters' storages get
        their old values back (their placeholders are dropped: nothing else holds them)."""
        olds, self.olds = self.olds, None
        for st, old in zip(self.storages, olds):
            st.array, st.version = old, st.version + 1
        self.members = []


def remember(counters: list) -> None:
    """``counters`` (tpu tensors) were a fused step program's step counters."""
    _COUNTERS.update(t._tpu_storage for t in counters)


def pending(counters: list) -> PendingAdd | None:
    """The pending increment of exactly ``counters``, if a fused step can take it: no
    placeholder of it read or held elsewhere."""
    if not counters or type(counters[0]) is not TpuTensor:
        return None
    p = getattr(counters[0]._tpu_storage.array, "program", None)   # (a placeholder's)
    if type(p) is not PendingAdd or p.olds is None or len(p.storages) != len(counters):
        return None
    for k, t in enumerate(counters):
        st, lz = p.storages[k], p.members[k]
        # held by its storage, the members list, ``lz`` and getrefcount's argument only
        if t._tpu_storage is not st or st.array is not lz or sys.getrefcount(lz) > 4:
            return None
    return p


@runtime_handler("aten::_foreach_add_.Scalar")
def add_to_counters(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """``_foreach_add_(tensors, alpha)``: left pending for step counters (see above),
    run as usual for everything else."""
    tensors = args[0]
    alpha = args[1] if len(args) > 1 else kwargs.get("scalar")
    if type(alpha) in (int, float) and tensors and eager_on_one_device() and _all_counters(tensors):
        PendingAdd([t._tpu_storage for t in tensors], alpha)
        return None
    return run_call(op, args, kwargs)


def eager_on_one_device() -> bool:
    """Ops run now, one by one (not traced, recorded or captured), on a single tpu device:
    where a fused step runs as its own program and its counters' increment can wait."""
    return not devices.several and graph_trace.active() is None and not lazy.recording() and not lazy.capturing()


def _all_counters(tensors: list) -> bool:
    storages = []
    for t in tensors:
        st = getattr(t, "_tpu_storage", None) if type(t) is TpuTensor else None
        if st is None or st not in _COUNTERS or not t._tpu_direct or t.dim() or t.dtype != torch.float32:
            return False
        storages.append(id(st))
    return len(set(storages)) == len(storages)
