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

import logging
from typing import Any, Sequence

import jax
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from tpu_kernels import dispatch, errors, random_state, shadow
from tpu_kernels.dispatch.graph_trace import GraphTrace, tracing
from tpu_kernels.lazy import concrete
from tpu_kernels.storage import Storage, to_jax, to_torch
from tpu_kernels.tensor import TpuTensor, wrap

log = logging.getLogger(__name__)

# Builders that may run a graph's program another way (tpu_kernels.distributed: a graph
# with collectives becomes one program over every rank's device): hook(gm, trace) returns
# the jitted callable, or None to leave the graph to the plain jax.jit.
_PROGRAM_HOOKS: list = []


def register_program_hook(hook) -> None:
    """Add ``hook(gm, trace) -> callable | None`` (see ``_PROGRAM_HOOKS``)."""
    if hook not in _PROGRAM_HOOKS:
        _PROGRAM_HOOKS.append(hook)


class GraphProgram:
    """``gm`` (an FX graph of ATen ops) as one jitted function over jax arrays."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        self.gm = gm
        self.is_tensor = [isinstance(x, torch.Tensor) for x in example_inputs]
        self.n_random = 0      # random ops in the graph (known after the first trace)
        self.traces = 0
        self.calls = 0
        self.impls: dict[tuple[str, str], int] = {}   # (op, impl kind) -> nodes, last trace
        self._layouts: dict[tuple, list] = {}   # statics -> where each output comes from
        self._checks: dict[tuple, list] = {}    # statics -> (op, checks) per flag output
        hooked = (hook(gm, self._trace) for hook in _PROGRAM_HOOKS)
        self._jitted = next((j for j in hooked if j is not None), None) or \
            jax.jit(self._trace, static_argnums=(0,))
        # a result shape that depends on values (bool-mask indexing, repeat_interleave by
        # a tensor) cannot be one XLA program: such a graph runs op by op, as eager does
        self.eager = any(free_unbacked_symbols(n.meta.get("val")) for n in gm.graph.nodes)
        if self.eager:
            log.info("a compiled graph has data-dependent shapes: it runs op by op")
        # outputs torch expects on the CPU (an optimizer's step counters, for one)
        outs = gm.graph.output_node().args[0]
        self.cpu_outputs = [i for i, n in enumerate(outs) if isinstance(n, torch.fx.Node)
                            and getattr(n.meta.get("val"), "device", None) == torch.device("cpu")]

    def __call__(self, *args: Any) -> list[Any]:
        tensors = [a for a, t in zip(args, self.is_tensor) if t]
        # CPU tensor inputs (0-dim scalars, step counters) ride along as host arrays
        cpu = {i: a for i, a in enumerate(tensors) if a.device.type == "cpu"}
        owners = [_host(a) if i in cpu else owner_of(a) for i, a in enumerate(tensors)]
        if self.eager:
            it = iter(owners)
            with torch.no_grad():
                out = list(self.gm(*(next(it) if t else a for a, t in zip(args, self.is_tensor))))
        else:
            out = self._run_jitted(args, owners)
        for i, a in cpu.items():    # the graph may have updated them in place
            st = owners[i]._tpu_storage
            if st.version:
                a.copy_(to_torch(st.array).reshape(a.shape))
        self.calls += 1
        return [o.cpu() if i in self.cpu_outputs else o for i, o in enumerate(out)]

    def lower(self, args: Sequence[Any], key: Any, arrays: Sequence[Any]) -> jax.stages.Lowered:
        """Lower, not run, the program for a call with ``args`` (their tensors' geometry
        and the graph's other arguments) over storages ``arrays`` and a random ``key``
        (abstract values, e.g. placed on a TPU chip: ``tpu_kernels.aot`` compiles models
        this way)."""
        statics = (tuple(_static(a) for a, t in zip(args, self.is_tensor) if not t),
                   tuple(_geometry(a) for a, t in zip(args, self.is_tensor) if t))
        return self._jitted.lower(statics, key, *arrays)

    def _run_jitted(self, args: tuple, owners: list) -> list[Any]:
        # storages go in whole (no copies); their views' geometry is part of the signature
        tensors = [concrete(o._tpu_storage.array) for o in owners]
        statics = (tuple(_static(a) for a, t in zip(args, self.is_tensor) if not t),
                   tuple(_geometry(o) for o in owners))
        taken = self.n_random
        key = random_state.reserve(taken)
        storages, flags = self._jitted(statics, key, *tensors)
        if self.n_random > taken:        # first trace: the graph's random ops are now known
            random_state.reserve(self.n_random - taken)
        for f, (op, checks) in zip(flags, self._checks[statics]):
            errors.watch(f, op, checks)
        return self._results(statics, owners, storages)

    def _results(self, statics: tuple, owners: list, arrays: list) -> list[Any]:
        """The graph's outputs as tpu tensors: views of the real inputs where the graph's
        outputs were views of its inputs (AOTAutograd rebuilds aliases from them), and
        new storages, shared as in the graph, for the rest; mutated inputs written back."""
        written, layout = self._layouts[statics]
        for k, slot in written:
            st = owners[k]._tpu_storage
            st.array, st.version = arrays[slot], st.version + 1
        new = {}
        out = []
        for entry in layout:
            if entry[0] == "value":
                out.append(entry[1])
                continue
            kind, where, geometry = entry
            if kind == "input":
                storage = owners[where]._tpu_storage
            else:
                storage = new.get(where) or new.setdefault(where, Storage(arrays[where]))
            out.append(TpuTensor(storage, *geometry))
        return out

    def _trace(self, statics: tuple, key: jax.Array, *arrays: jax.Array):
        """Run the graph on tpu tensors over the jit's tracers; returns the storages the
        outputs live in (and mutated inputs' new values) plus the check flags."""
        self.traces += 1
        scalars, geometries = statics
        inputs = [TpuTensor(Storage(a), *g) for a, g in zip(arrays, geometries)]
        views, st = iter(inputs), iter(scalars)
        args = [next(views) if t else next(st) for t in self.is_tensor]
        before = dispatch.op_counts()
        result, flags = self._run_graph(args, key)
        after = dispatch.op_counts()
        self.impls = {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}
        storages, self._layouts[statics] = _output_layout(
            [t._tpu_storage for t in inputs], arrays, result)
        self._checks[statics] = [(op, checks) for _, op, checks in flags]
        log.debug("traced a graph of %d nodes: %d outputs, %d random ops, %d checks",
                  len(self.gm.graph.nodes), len(result), self.n_random, len(flags))
        return storages, [f for f, _, _ in flags]

    def _run_graph(self, args: list, key: jax.Array) -> tuple[Any, list]:
        """The graph's nodes dispatched inside this trace: random ops take keys from
        ``key``, check flags become outputs, results take torch's strides."""
        with tracing(GraphTrace(key)) as trace, torch.no_grad():
            result = self.gm(*args)
        self.n_random = max(self.n_random, trace.random_ops)
        return result, trace.checks


def _output_layout(inputs: list[Storage], arrays: tuple, result: Any) -> tuple[list, tuple]:
    """Which storages leave the jit and how the outputs are cut from them: an output that
    is a view of an input stays one (geometry over the real input's storage); outputs
    sharing a new storage keep sharing it; inputs whose storage changed are written."""
    storages: list = []
    slots: dict[int, int] = {}

    def slot(st: Storage) -> int:
        if id(st) not in slots:
            slots[id(st)] = len(storages)
            storages.append(st.array)
        return slots[id(st)]

    written = [(k, slot(st)) for k, (st, a) in enumerate(zip(inputs, arrays)) if st.array is not a]
    layout = []
    for o in result:
        if not isinstance(o, TpuTensor):
            layout.append(("value", o))
            continue
        st, geometry = o._tpu_storage, _geometry(o)
        k = next((k for k, s in enumerate(inputs) if s is st), None)
        layout.append(("input", k, geometry) if k is not None else ("new", slot(st), geometry))
    return storages, (written, layout)


def owner_of(x: torch.Tensor) -> TpuTensor:
    """The tpu tensor behind a compiled graph's tensor argument (a shadow or itself)."""
    if isinstance(x, TpuTensor):
        return x
    owner = shadow.owner(x)
    if owner is None:
        raise RuntimeError(
            f"a compiled tpu graph got a tensor it cannot read (shape {tuple(x.shape)}, "
            f"{x.dtype}, device {x.device}): only tpu tensors can be its inputs")
    return owner


def _host(t: torch.Tensor) -> TpuTensor:
    """A CPU tensor as a tpu tensor over a host array (jit moves it with the call)."""
    if t.dtype == torch.bfloat16 or not t.is_contiguous() or t.is_conj() or t.is_neg():
        return wrap(to_jax(t), t.dtype)
    return wrap(t.detach().numpy(), t.dtype)


def _static(a: Any) -> Any:
    if isinstance(a, torch.SymInt):
        return int(a)
    if isinstance(a, torch.SymFloat):
        return float(a)
    return a


def _geometry(t: TpuTensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype

