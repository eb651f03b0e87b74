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

import functools
import logging
from typing import Any, Sequence

import jax
import numpy as np
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, optimization_hint
from torch.utils._python_dispatch import _disable_current_modes

from tpu_kernels import devices, dispatch, errors, inflight, program_packs, random_state, shadow, strided
from tpu_kernels.dispatch.results import wrap_result
from tpu_kernels.compile_options import CompileOptions
from tpu_kernels.dispatch.graph_trace import PROGRAM_HOOKS, GraphTrace, tracing
from tpu_kernels.graph_host_ops import constants_on_device, program_device, random_on_device
from tpu_kernels.graph_inputs import HostScalars, source_of
from tpu_kernels.graph_outputs import on_cpu, output_layout, pack_saved, source_of_output
from tpu_kernels.host_writes import HostWrites
from tpu_kernels.pallas.tpu_info import pinned
from tpu_kernels.registry import REGISTRY
from tpu_kernels.registry.context import INDEX_CHECKS
from tpu_kernels.lazy import Lazy, capturing, concrete
from tpu_kernels.program_packs import PackedCalls
from tpu_kernels.storage import Storage, to_torch
from tpu_kernels.tensor import TpuTensor, wrap_known, wrap_view
from tpu_kernels.tensor_values import read, source as tensor_source
log = logging.getLogger(__name__)

class GraphProgram(PackedCalls):
    """``gm`` (an FX graph of ATen ops) as one jitted function over jax arrays."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 options: CompileOptions | None = None, written: Sequence[int] | None = None) -> None:
        """``written``: positions of the tensor inputs the graph writes by in-place ops (a
        graph the runtime builds); AOTAutograd's graphs write inputs by ``copy_``."""
        self.gm = gm
        self.options = options or CompileOptions()
        self.is_tensor = [isinstance(x, torch.Tensor) for x in example_inputs]
        self.n_random = 0      # random ops in the graph (known after the first trace)
        self.traces = 0
        self.calls = 0
        self.impls: dict[tuple[str, str], int] = {}   # (op, impl kind) -> nodes, last trace
        self._layouts: dict[tuple, tuple] = {}  # statics -> where each output comes from
        self._outputs: dict[tuple, tuple] = {}  # statics -> (its layout, (op, checks) per flag)
        constants_on_device(gm)
        random_on_device(gm, program_device(example_inputs))
        # a result shape that depends on values (bool-mask indexing, repeat_interleave by
        # a tensor) cannot be one XLA program: such a graph runs op by op, as eager does
        self.eager = any(free_unbacked_symbols(n.meta.get("val")) for n in gm.graph.nodes)
        if self.eager:
            log.info("a compiled graph has data-dependent shapes: it runs op by op")
        # outputs torch expects on the CPU (a CPU counter the graph bumps, for one)
        outs = gm.graph.output_node().args[0]
        self.cpu_outputs = [i for i, n in enumerate(outs) if isinstance(n, torch.fx.Node)
                            and getattr(n.meta.get("val"), "device", None) == torch.device("cpu")]
        # tensor inputs (their positions among the tensors) that live on the CPU: Dynamo
        # guards every input's device, so a program always gets them there
        self.cpu_inputs = [k for k, x in enumerate(x for x in example_inputs if isinstance(x, torch.Tensor))
                           if x.device.type == "cpu"]
        self.all_tensors = all(self.is_tensor)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        positions = {n: k for k, n in enumerate(n for n, t in zip(placeholders, self.is_tensor) if t)}
        host = HostWrites(gm, positions)
        self.host = host if host.writes and not self.eager else None
        self.aot_meta = None   # AOTAutograd's metadata of the graph, set by the backend
        # outputs from this position on leave as (storage, geometry) sources, not tensors:
        # activations only a backward program reads (compile_train_fast_path) need no wrapper
        self.raw_from: int | None = None
        # the random key of the last call, and one the next call takes instead of new
        # counters (a forward run again for its backward draws what it drew: compile_joint)
        self.last_key: Any = None
        self.replay_key: Any = None
        self.scalars: HostScalars | None = None   # set below where the program is our own jit
        hooked = next((j for j in (hook(gm, self._trace) for hook in PROGRAM_HOOKS) if j is not None), None)
        # device inputs the graph writes (an optimizer's parameters and moments) are donated:
        # XLA writes their new values over the old buffers, so a step holds one copy of them
        self.donated = () if hooked is not None else \
            tuple(written) if written is not None else _written_inputs(gm, positions, self.cpu_inputs)
        if hooked is None and not self.eager:   # 0-dim CPU inputs cross as one array per dtype
            self.scalars = HostScalars.of([x for x in example_inputs if isinstance(x, torch.Tensor)])
        self._jitted = hooked or self._jit()
        # small state it writes (an optimizer's moments) can travel packed: program_packs.py
        self._init_packs(hooked is None and bool(self.donated) and self.host is None
                         and self.scalars is None and not devices.several)

    def __call__(self, *args: Any) -> list[Any]:
        if capturing():
            # it would run now, and the capture would keep its results as constants
            raise RuntimeError(
                "a torch.compile'd graph ran inside a tpu graph capture (torch.tpu.graph), which "
                "cannot record it: capture the model uncompiled (the capture already runs the "
                "whole block as one executable)")
        tensors = args if self.all_tensors else [a for a, t in zip(args, self.is_tensor) if t]
        # (storage, geometry) per tensor input; a tpu tensor's without a shadow made
        sources = [tensor_source(a) if type(a) is TpuTensor else source_of(a) for a in tensors]
        host = self.host
        if host is not None:     # CPU inputs updated on the host (see host_writes.py; the
            updates = host.compute(tensors)   # program reads copies: graph_inputs._host)
        if self.eager:
            it = (TpuTensor(st, *g) for st, g in sources)
            with torch.no_grad():
                out = list(self.gm(*(next(it) if t else a for a, t in zip(args, self.is_tensor))))
        else:
            out = self._run_jitted(args, sources)
        for k in self.cpu_inputs:           # the graph may have updated CPU inputs
            a, st = tensors[k], sources[k][0]
            if st.version and (host is None or k not in host.written):
                a.copy_(to_torch(st.array).reshape(a.shape))
        if host is not None:
            host.write(tensors, updates)
        self.calls += 1
        if self.cpu_outputs:
            out = [on_cpu(o) if i in self.cpu_outputs else o for i, o in enumerate(out)]
        return out

    def lower(self, args: Sequence[Any], key: Any, arrays: Sequence[Any]) -> jax.stages.Lowered:
        """Lower, not run, the program for a call with ``args`` (their tensors' geometry
        and the graph's other arguments) over storages ``arrays`` and a random ``key``
        (abstract values, e.g. placed on a TPU chip: ``tpu_kernels.aot`` compiles models
        this way)."""
        statics = (settings(), tuple(_static(a) for a, t in zip(args, self.is_tensor) if not t),
                   tuple(shadow.geometry(a) for a, t in zip(args, self.is_tensor) if t))
        return self._jitted.lower(statics, key, *self.arguments(arrays))

    def arguments(self, arrays: Sequence[Any]) -> list[Any]:
        """The jitted function's array arguments from the tensor inputs' arrays."""
        return list(arrays) if self.scalars is None else self.scalars.pack(arrays)

    def donated_argnums(self) -> tuple[int, ...]:
        """Positions of the donated inputs among the jitted function's arguments (after
        the statics and the key, with host scalars packed)."""
        where = self.scalars.where if self.scalars is not None else None
        return tuple(2 + (k if where is None else where[k]) for k in self.donated)

    def _jit(self, donate: bool = True) -> Any:
        donated = self.donated_argnums() if donate else ()
        return jax.jit(self._trace, static_argnums=(0,), donate_argnums=donated)

    def _run_jitted(self, args: tuple, sources: list) -> list[Any]:
        statics = self._statics(args, sources)
        if self._packable and program_packs.enabled():
            out = self._run_packed(args, sources, statics)
            if out is not None:
                return out
        # storages go in whole (no copies); their views' geometry is part of the signature
        tensors = [st.array if type(st.array) is not Lazy else concrete(st.array) for st, _ in sources]
        program_packs.own_donated(tensors, [sources[k][0] for k in self.donated], self.donated)
        taken = self.n_random
        key = self._key(taken)
        try:
            out = self._jitted(statics, key, *self.arguments(tensors))
        except _NotWritten:     # (raised while tracing: nothing was donated yet)
            log.warning("a compiled graph's copy_ into an input did not write it: no inputs donated")
            self.donated = ()
            self._jitted = self._jit()
            out = self._jitted(statics, key, *self.arguments(tensors))
        storages, flags = inflight.track(out)
        if self.n_random > taken:        # first trace: the graph's random ops are now known
            random_state.reserve(self.n_random - taken)
        layout, checks = self._outputs[statics]
        for f, (op, c) in zip(flags, checks):
            errors.watch(f, op, c)
        return self._results(layout, sources, storages)

    def _key(self, taken: int) -> Any:
        # a graph without random ops (known once traced) takes one resident key: no
        # counters to reserve, nothing to move to the device per call
        key, self.replay_key = self.replay_key, None
        if key is None:
            key = random_state.reserve(taken) if taken or not self.traces else _no_key()
        self.last_key = key
        return key

    def _statics(self, args: tuple, sources: list) -> tuple:
        """The jit's static argument of a call: settings, non-tensor arguments, geometries."""
        scalars = () if self.all_tensors else \
            tuple(_static(a) for a, t in zip(args, self.is_tensor) if not t)
        return (settings(), scalars, tuple(g for _, g in sources))

    def _results(self, layout: tuple, sources: list, arrays: list) -> list[Any]:
        """The graph's outputs as tpu tensors: views of the real inputs where the graph's
        outputs were views of its inputs (AOTAutograd rebuilds aliases from them), and
        new storages, shared as in the graph, for the rest; mutated inputs written back."""
        written, layout = layout
        for k, slot in written:
            st = sources[k][0]
            st.array, st.version = arrays[slot], st.version + 1
        new = {}
        out = []
        cut = self.raw_from
        for entry in layout if cut is None else layout[:cut]:
            if entry[0] == "value":
                out.append(entry[1])
                continue
            kind, where, geometry, known = entry
            if kind == "whole":        # the only view of a new storage, all of it
                out.append(wrap_known(arrays[where], *geometry))
                continue
            if kind == "input":
                storage = sources[where][0]
                if known is not None:   # whole-storage layout: a direct view if the sizes match
                    a = storage.array
                    known = known[0] and a.shape == geometry[0] and a.dtype == known[1]
            else:
                storage = new.get(where) or new.setdefault(where, Storage(arrays[where], None, known[1]))
                known = known[0]     # (None for an empty view: TpuTensor gives it a torch storage)
            out.append(TpuTensor(storage, *geometry) if known is None else wrap_view(storage, *geometry, known))
        if cut is not None:
            out += [source_of_output(e, sources, arrays, new) for e in layout[cut:]]
        return out

    def _trace(self, statics: tuple, key: jax.Array, *arrays: jax.Array, count: bool = True):
        """Run the graph on tpu tensors over the jit's tracers; returns the storages the
        outputs live in (and mutated inputs' new values) plus the check flags. ``count``:
        a signature's first trace (not a packed variant of one, program_packs.py)."""
        self.traces += count
        if self.traces > 1:   # a graph with dynamic shapes (a growing KV cache) meets a new size
            log.info("a compiled graph is traced again (%d traces): each input shape is its own "
                     "XLA program (a static KV cache keeps decoding to one)", self.traces)
        _, scalars, geometries = statics
        if self.scalars is not None:
            arrays = tuple(self.scalars.unpack(arrays))
        inputs = [TpuTensor(Storage(a), *g) for a, g in zip(arrays, geometries)]
        views, st = iter(inputs), iter(scalars)
        args = [next(views) if t else next(st) for t in self.is_tensor]
        before = dispatch.op_counts()
        with self.options.tracing():
            result, flags = self._run_graph(args, key)
        after = dispatch.op_counts()
        self.impls = {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}
        # (an input the host writes is not a result: the program's copy would not be read)
        host = self.host.written if self.host is not None else ()
        if self.raw_from is not None:     # saved for our backward program only (see there)
            result = pack_saved(list(result), self.raw_from, [t._tpu_storage for t in inputs])
        storages, layout = output_layout([t._tpu_storage for t in inputs], arrays, result, host)
        if not set(self.donated) <= {k for k, _ in layout[0]}:
            raise _NotWritten()
        self._layouts[statics] = layout
        self._outputs[statics] = (layout, [(op, checks) for _, op, checks in flags])
        log.debug("traced a graph of %d nodes: %d outputs, %d random ops, %d checks",
                  len(self.gm.graph.nodes), len(result), self.n_random, len(flags))
        return storages, [f for f, _, _ in flags]

    def _run_graph(self, args: list, key: jax.Array) -> tuple[Any, list]:
        """The graph's nodes dispatched inside this trace: random ops take keys from
        ``key``, check flags become outputs, results take torch's strides. Dispatch modes
        torch holds around the call (AOTAutograd's custom-op check on a first call) are
        off: the nodes run on the trace's values, not as torch-level ops (and that mode
        would turn a higher-order op on tpu tensors into NotImplemented)."""
        with tracing(GraphTrace(key)) as trace, torch.no_grad(), _disable_current_modes():
            result = _StridedRun(self.gm).run(*args)
        self.n_random = max(self.n_random, trace.random_ops)
        return result, trace.checks


class _StridedRun(torch.fx.Interpreter):
    """Runs the graph's nodes, giving each new result the strides recorded in the graph:
    later views were recorded against them. The dispatcher's own choice can differ (its
    cached result layout may come from an eager call whose inputs were laid out otherwise)."""

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        if n.op != "call_function" or _returns_alias(n.target):
            return out
        val = n.meta.get("val")
        if isinstance(out, (list, tuple)) and isinstance(val, (list, tuple)) and len(out) == len(val):
            return type(out)(_restride(o, v) for o, v in zip(out, val))
        return _restride(out, val)


class _NotWritten(Exception):
    """A donated input the traced graph did not write (its buffer would be lost)."""


def copied_inputs(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The graph's inputs (placeholders) it ``copy_``s into: the inputs it writes."""
    placeholders = set(gm.graph.find_nodes(op="placeholder"))
    copies = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default)
    return {n.args[0] for n in copies if n.args[0] in placeholders}


def _written_inputs(gm: torch.fx.GraphModule, positions: dict[torch.fx.Node, int],
                    cpu_inputs: list[int]) -> tuple[int, ...]:
    """Positions of the device tensor inputs the graph ``copy_``s into."""
    written = {positions[n] for n in copied_inputs(gm) if n in positions}
    return tuple(sorted(written - set(cpu_inputs)))


def _returns_alias(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def _restride(out: Any, val: Any) -> Any:
    """``out`` laid out with ``val``'s strides, if it is a new dense tensor that differs."""
    if not isinstance(out, TpuTensor) or not isinstance(val, torch.Tensor) or out.dim() == 0:
        return out
    if any(isinstance(n, torch.SymInt) for n in (*val.shape, *val.stride())):
        val = _concrete_like(val, tuple(out.shape))
        if val is None:
            return out
    stride = val.stride()
    if out.stride() == stride or out.storage_offset() != 0 or out._tpu_storage.numel != out.numel():
        return out
    if strided.memory_order(tuple(out.shape), stride) is None:
        return out
    return wrap_result(read(out), val)


def _concrete_like(val: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    """A meta tensor of ``shape`` laid out in the memory order of ``val``, a result traced
    with symbolic sizes (``dynamic=True``): its dims' order at the sizes it was traced
    with (None if that is not dense)."""
    hint = [tuple(optimization_hint(n) for n in t) for t in (val.shape, val.stride())]
    order = strided.memory_order(*hint)
    if order is None:
        return None
    stride, acc = [0] * len(shape), 1
    for d in reversed(order):
        stride[d], acc = acc, acc * max(shape[d], 1)
    return torch.empty_strided(shape, stride, dtype=val.dtype, device="meta")


@functools.cache
def _no_key() -> jax.Array:
    return jax.device_put(np.zeros(3, np.uint32))


def settings() -> tuple:
    """What the registry decides by besides the arguments (its table and switches, matmul
    precision, the default dtype, index checks, the chip kernels are compiled for): part of every program's
    key, so a call under other settings traces again."""
    return (REGISTRY.switches(), torch.get_float32_matmul_precision(), torch.get_default_dtype(),
            INDEX_CHECKS.on, pinned())


def _static(a: Any) -> Any:
    if isinstance(a, torch.SymInt):
        return int(a)
    if isinstance(a, torch.SymFloat):
        return float(a)
    return a
