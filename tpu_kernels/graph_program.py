"""One compiled graph as one XLA program.

AOTAutograd hands the ``tpu`` backend graphs of ATen ops on plain tensors (a forward, a
backward, or an inference graph). A ``GraphProgram`` runs such a graph inside a single
``jax.jit``: the graph's inputs become tpu tensors over the jit's tracers and each node
dispatches through the same registry as eager (so Pallas, Helion, user kernels and
custom ops appear in compiled graphs exactly where eager would pick them), which records
the whole graph into one jaxpr. XLA compiles it once per input shape signature.

Random ops draw keys from one traced input (a block of the device generator's counters
taken per call), and device-side checks (index bounds) come back as extra outputs that
are watched like eager's.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import torch

from tpu_kernels import errors, random_state, traced
from tpu_kernels.deferred_mode import force
from tpu_kernels.tensor import LAYOUTS, Storage, TpuTensor, value, wrap

log = logging.getLogger(__name__)


class GraphProgram:
    """``gm`` (an FX graph of ATen ops) as one jitted function over jax arrays."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        self.gm = gm
        self.is_tensor = [isinstance(x, torch.Tensor) for x in example_inputs]
        self.n_random = 0      # random ops in the graph (known after the first trace)
        self.traces = 0
        self.calls = 0
        self._layouts: dict[tuple, list] = {}   # statics -> where each output comes from
        self._checks: dict[tuple, list] = {}    # statics -> (op, checks) per flag output
        self._jitted = jax.jit(self._trace, static_argnums=(0,))

    def __call__(self, *args: Any) -> list[Any]:
        owners = [traced.owner_of(a) for a, t in zip(args, self.is_tensor) if t]
        # storages go in whole (no copies); their views' geometry is part of the signature
        tensors = [force(o._tpu_storage.array) for o in owners]
        statics = (tuple(_static(a) for a, t in zip(args, self.is_tensor) if not t),
                   tuple(_geometry(o) for o in owners))
        taken = self.n_random
        key = random_state.reserve(taken)
        outs, flags = self._jitted(statics, key, *tensors)
        if self.n_random > taken:        # first trace: the graph's random ops are now known
            random_state.reserve(self.n_random - taken)
        for f, (op, checks) in zip(flags, self._checks[statics]):
            errors.watch(f, op, checks)
        self.calls += 1
        return [wrap(outs[v], dt) if kind == "t" else v for kind, v, dt in self._layouts[statics]]

    def _trace(self, statics: tuple, key: jax.Array, *arrays: jax.Array):
        self.traces += 1
        scalars, geometries = statics
        views = iter([TpuTensor(Storage(a), *g) for a, g in zip(arrays, geometries)])
        st = iter(scalars)
        args = [next(views) if t else next(st) for t in self.is_tensor]
        counter = itertools.count()
        random_state._local.source = lambda: key + jnp.array([0, 0, next(counter)], jnp.uint32)
        errors._local.sink = sink = []
        LAYOUTS.torch_strides = True
        try:
            with torch.no_grad():
                result = self.gm(*args)
        finally:
            random_state._local.source = None
            errors._local.sink = None
            LAYOUTS.torch_strides = False
        self.n_random = max(self.n_random, next(counter))
        layout, out = [], []
        for o in result:
            if isinstance(o, TpuTensor):
                layout.append(("t", len(out), o.dtype))
                out.append(value(o))
            else:
                layout.append(("c", o, None))
        self._layouts[statics] = layout
        self._checks[statics] = [(op, checks) for _, op, checks in sink]
        log.debug("traced a graph of %d nodes: %d outputs, %d random ops, %d checks",
                  len(self.gm.graph.nodes), len(out), self.n_random, len(sink))
        return out, [f for f, _, _ in sink]


def _static(a: Any) -> Any:
    if isinstance(a, torch.SymInt):
        return int(a)
    if isinstance(a, torch.SymFloat):
        return float(a)
    return a


def _geometry(t: TpuTensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype

