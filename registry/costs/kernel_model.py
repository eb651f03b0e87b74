"""A kernel impl's modelled time on a chip, from the program it traces.

The impl is traced (``jax.make_jaxpr``, inside ``tpu_info.compile_for(chip)`` so blocks
are sized for that chip) and its jaxpr walked:

- each kernel (``pallas_call``, or the ``mpmd_map`` Helion emits) costs what its own ``pl.CostEstimate`` says its grid moves
  (padded operands, re-fetched tiles) against the chip's roofline, plus a fixed cost per
  grid step; f32 operands of a kernel that multiplies on the MXU cost ``F32_MXU_PASSES``
  bf16 passes (Precision.HIGHEST);
- every other equation (the wrapper's pads, slices, casts, transposes) is an HBM pass:
  it reads its inputs and writes its output; reshapes and squeezes are free.

time = sum over kernels of (max(flops / peak, bytes / bandwidth) + steps * STEP_SECONDS)
     + sum over other equations of bytes / bandwidth
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import numpy as np

from tpu_kernels.pallas import tpu_info

# A grid step's fixed cost on TensorCore (pipeline prologue, DMA issue, semaphore waits):
# the ~0.35 us per step figure JAX's Pallas TPU docs give for small blocks.
STEP_SECONDS = 0.35e-6
# f32 x f32 on the MXU at Precision.HIGHEST: six bf16 passes.
F32_MXU_PASSES = 6
# Equations that move no data (metadata only, or scalars).
_FREE = frozenset({"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "iota",
                   "copy_p", "stop_gradient", "device_put"})


@dataclasses.dataclass(frozen=True)
class Modelled:
    """What a kernel impl's program costs on one chip."""
    chip: str
    flops: float             # MXU-equivalent flops the kernels execute (padding included)
    kernel_bytes: float      # HBM bytes the kernels' grids move
    wrapper_bytes: float     # HBM bytes of the passes around the kernels (pad, slice, cast)
    steps: int               # grid steps, all kernels
    kernels: int             # pallas_calls in the program
    seconds: float

    def roofline_fraction(self, useful_seconds: float) -> float:
        """The share of this time the op's useful work needs at the roofline."""
        return useful_seconds / self.seconds if self.seconds else 0.0


def model(fn: Callable[..., Any], specs: list, chip: str) -> Modelled:
    """Trace ``fn(*specs)`` for ``chip`` and add up what its kernels and wrapper cost."""
    row = tpu_info.chip(chip)
    with tpu_info.compile_for(row):
        # a fresh callable per call: jax caches a trace by function identity, and the
        # chip (which picks the kernels' blocks) is not part of that key
        closed = jax.make_jaxpr(lambda *a: fn(*a))(*specs)
    acc = _Acc(row)
    acc.walk(closed.jaxpr)
    return acc.result()


class _Acc:
    def __init__(self, row: tpu_info.Chip) -> None:
        self.row = row
        self.flops = self.kbytes = self.wbytes = 0.0
        self.steps = self.kernels = 0
        self.seconds = 0.0

    def walk(self, jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if "cost_estimate" in eqn.params:     # pallas_call, or Helion's mpmd_map
                self._kernel(eqn)
                continue
            subs = _subjaxprs(eqn)
            if subs:
                for sub in subs[:1] if name in ("cond", "switch") else subs:
                    self.walk(sub)     # one branch of a cond runs
                continue
            if name not in _FREE:
                moved = sum(_nbytes(v.aval) for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval"))
                self.wbytes += moved
                self.seconds += moved / self.row.hbm_bytes_per_s

    def _kernel(self, eqn: Any) -> None:
        est = eqn.params["cost_estimate"]
        mapping = eqn.params.get("grid_mapping")
        grid = tuple(mapping.grid) if mapping is not None else ()   # Helion pipelines inside
        steps = math.prod(_extent(g, eqn, mapping) for g in grid) if grid else 1
        flops = float(est.flops) if est is not None else 0.0
        moved = float(est.bytes_accessed) if est is not None else sum(
            _nbytes(v.aval) for v in (*eqn.invars, *eqn.outvars))
        if _f32_dot(eqn):
            flops *= F32_MXU_PASSES
        self.flops += flops
        self.kbytes += moved
        self.steps += steps
        self.kernels += 1
        self.seconds += max(flops / self.row.bf16_flops, moved / self.row.hbm_bytes_per_s) + steps * STEP_SECONDS

    def result(self) -> Modelled:
        return Modelled(self.row.name, self.flops, self.kbytes, self.wbytes, self.steps,
                        self.kernels, self.seconds)


def _extent(g: Any, eqn: Any, mapping: Any) -> int:
    """A grid axis's step count. A dynamic axis (a work list sized by the data, e.g. the
    grouped matmul's) counts at its bound: the length of the first scalar-prefetch
    operand, the list it walks."""
    if isinstance(g, int):
        return g
    lists = eqn.invars[mapping.num_dynamic_grid_bounds:]
    shape = getattr(lists[0].aval, "shape", ()) if lists else ()
    return int(shape[0]) if shape else 1


def _subjaxprs(eqn: Any) -> list:
    out = []
    for v in eqn.params.values():
        for item in v if isinstance(v, (tuple, list)) else (v,):
            if hasattr(item, "eqns"):
                out.append(item)
            elif hasattr(getattr(item, "jaxpr", None), "eqns"):
                out.append(item.jaxpr)
    return out


def _f32_dot(eqn: Any) -> bool:
    """A kernel whose body multiplies f32 operands on the MXU."""
    stack = _subjaxprs(eqn)
    while stack:
        j = stack.pop()
        for e in j.eqns:
            if e.primitive.name == "dot_general":
                if any(getattr(v.aval, "dtype", None) == np.float32 for v in e.invars):
                    return True
            stack.extend(_subjaxprs(e))
    return False


def _nbytes(aval: Any) -> int:
    shape = getattr(aval, "shape", None)
    if shape is None:
        return 0
    return math.prod(shape) * np.dtype(aval.dtype).itemsize
