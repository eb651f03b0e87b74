"""The executable cache: one ``CompiledCall`` per call signature, bounded (LRU), and the
counters the demo, tests and bench read (calls per op and impl kind, traces per op)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from tpu_kernels.dispatch.plan import OpPlan
from tpu_kernels.lru import LRU
from tpu_kernels.registry import REGISTRY, Impl
from tpu_kernels.registry.context import INDEX_CHECKS


@dataclasses.dataclass(eq=False)
class CompiledCall:
    """What one call signature runs: the impl, its jitted function, and how to wrap."""
    impl: Impl
    fn: Callable[..., Any] | None   # jitted (or eager, for data-dependent impls)
    plan: OpPlan
    result_meta: Any                # torch meta result (structure of the returns)
    write_dtypes: list              # for mutated args: torch dtype to write, per leaf
    calls: int = 0
    torch_fn: Callable[..., Any] | None = None   # decomposition / CPU fallback (torch land)
    # one non-empty tensor returned, nothing written: its (sizes, contiguous strides, dtype, bytes)
    single_out: tuple | None = None
    lazy_spec: tuple | None = None   # the jitted function's output structure (lazy.out_spec)
    # what the hot path calls with concrete arrays: ``fn``, or the executable ``fn`` runs
    # once the call cache's runner has settled on it (``fn`` again on its TypeError)
    call: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if self.call is None:
            self.call = self.fn


_RETIRED: dict[tuple[str, str], int] = {}   # calls of evicted entries, for op_counts


def _retire(key: Any, compiled: CompiledCall) -> None:
    k = (str(compiled.plan.op), compiled.impl.kind)
    _RETIRED[k] = _RETIRED.get(k, 0) + compiled.calls
    FAST.clear()   # it may index the evicted entry; calls fill it again


CALLS = LRU(on_evict=_retire)   # call signature -> CompiledCall (a compiled executable): bounded
# the hot path's index into CALLS for calls of positional tensors and numbers only:
# (op state, mode token, each argument's geometry) ->
#     (CompiledCall, positions of its leaves, its key in CALLS, the CALLS it is in)
FAST: dict[tuple, tuple] = {}
VIEWS = LRU()                   # view signature -> torch's meta result
# the hot path's index of views with int arguments: (op, base's geometry token, its
# storage array's shape and dtype, the arguments) -> the view's geometry (views.py)
FAST_VIEWS: dict[tuple, tuple] = {}
TRACES: dict[Any, int] = {}     # op -> number of times an impl was traced for it


def mode_token() -> tuple:
    """Settings read while an op is traced: part of every cache key, so changing one retraces."""
    return (REGISTRY.epoch, _matmul_precision(), _default_dtype(), INDEX_CHECKS.on)


_matmul_precision = torch._C._get_float32_matmul_precision   # torch.get_float32_matmul_precision, one frame less
# the dtype of factories without one and of Python floats meeting integer tensors
_default_dtype = torch.get_default_dtype   # (a builtin)


def op_counts() -> dict[tuple[str, str], int]:
    """Calls per (op, impl kind) since start: what the demo's table shows."""
    counts: dict[tuple[str, str], int] = dict(_RETIRED)
    for e in CALLS.values():
        k = (str(e.plan.op), e.impl.kind)
        counts[k] = counts.get(k, 0) + e.calls
    return counts


def cache_info() -> dict[str, Any]:
    """Hits, misses, evictions and size of the executable cache and the view cache."""
    return {"ops": CALLS.info(), "views": VIEWS.info()}


def clear_cache() -> None:
    CALLS.clear()
    FAST.clear()
    _RETIRED.clear()
    VIEWS.clear()
    FAST_VIEWS.clear()
    TRACES.clear()
