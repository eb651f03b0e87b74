"""Captured graphs: a whole step recorded once, replayed as one XLA executable.

    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):                  # records; nothing runs
        loss = model(static_x).sum(); loss.backward(); opt.step()
    for x in batches:
        static_x.copy_(x)
        g.replay()                            # one executable: no Python per op

``torch.cuda.graph``'s contract, on tpu storages instead of device memory. The capture
records every tpu op of the block into one program (deferred mode's ``lazy`` recording,
with no length limit and no stage boundaries) and runs none of it. ``capture_end`` binds
the program to memory: an input read from a storage that existed when the capture began
is read from that storage at each replay (its value then, as a kernel reads an address);
a storage the block left holding a recorded value gets that value at each replay (a
parameter an optimizer updated, a ``.grad`` or a loss made in the block). Each replay is
one jitted call on the storages' current arrays, and writes its results back; the small
ones it both reads and writes (parameters, optimizer moments and steps) go round as one
buffer per dtype, which nothing cuts up unless something reads them between replays
(``graph_packing.py``: a call's host cost grows with its inputs and outputs).

What a replay cannot see is fixed at capture, as with CUDA graphs:

- Python values (a learning rate, ``if`` on a shape) and arrays made in the block outside
  the recording are constants. Optimizers must keep their step on the device
  (``capturable=True``); one that would count on the host raises, as torch's does on CUDA.
- Memory made in the block belongs to the graph: keep using those tensors (``static_loss``),
  and do not set ``.grad`` to None after capture (``zero_grad(set_to_none=True)`` before it).
- Warm up first (a few steps outside the capture) so the optimizer's state exists: state
  made in the block is made anew at every replay.
- A value read in the block (``.item()``, printing, data-dependent shapes) raises: nothing
  has run. Random ops draw fresh counters of the device's generator at every replay.

The block's own outputs hold zeros until the first replay (CUDA leaves them unwritten),
and storages written in the block keep their values from before it.
"""
from __future__ import annotations

import gc
import sys
from typing import Any, Iterator

import contextlib
import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tpu_kernels import errors, graph_packing, inflight, lazy, lazy_programs, random_state
from tpu_kernels.graph_packing import Pack
from tpu_kernels.lazy import Lazy
from tpu_kernels.storage import Storage

__all__ = ["TPUGraph", "graph", "graph_pool_handle", "install"]


def _storages() -> list[Storage]:
    """Every live storage (a capture's two walks: where memory was, where it goes)."""
    return [o for o in gc.get_objects() if type(o) is Storage]


def _unshared(storages: list[Storage]) -> list[Storage]:
    """``storages``, each with an array of its own: the recording knows its inputs by array,
    so storages that share one (small constant fills do, ``runtime_ops/constant_fills.py``;
    distinct storages never alias) would be read as one memory. A copy each for the others."""
    seen: set[int] = set()
    for st in storages:
        a = st.array
        if isinstance(a, jax.Array):
            if id(a) in seen:
                st.array = jnp.array(a, copy=True)
            seen.add(id(a))
    return storages


def _value(a: Any) -> Any:
    return a.value if type(a) is Lazy else a


class _Program:
    """The jitted replay of a captured recording: ``(keys, constants, buffers, *arrays)``
    -> (the packs' new buffers, the other values written back). Each input is a storage's
    array or a member of a pack's buffer, a random key (a row of ``keys``), a constant or
    a Python number (traced in, as it was recorded)."""

    def __init__(self, prog: lazy.Program, sources: list, wanted: tuple, donated: tuple,
                 packs: list[Pack], kept: list[int]) -> None:
        self.nodes, self.sources, self.wanted, self.packs = prog.nodes, sources, wanted, packs
        self.kept = kept   # results returned as they are (the packs' are joined into buffers)
        # the packs' buffers (argument 2) are consumed; so are the other reads it writes
        self.jitted = jax.jit(self._run, donate_argnums=(2, *(3 + k for k in donated)))

    def _run(self, keys: Any, constants: list, buffers: list, *arrays: Any) -> tuple:
        cut = [p.split(b) for p, b in zip(graph_packing.reading(self.packs), buffers)]
        inputs = []
        for kind, v in self.sources:
            inputs.append(arrays[v] if kind == "storage" else cut[v[0]][v[1]] if kind == "packed"
                          else keys[v] if kind == "key" else constants[v] if kind == "constant" else v)
        results = lazy_programs.run_nodes(self.nodes, inputs, self.wanted)
        return [p.join([results[j] for j in p.slots]) for p in self.packs], [results[j] for j in self.kept]


class TPUGraph:
    """A captured tpu graph (``torch.cuda.CUDAGraph``'s API): ``capture_begin``,
    ``capture_end``, ``replay``, ``reset``, ``pool``."""

    def __init__(self, keep_graph: bool = False) -> None:
        self._capturing = False
        self._before: dict[Storage, Any] = {}
        self.reset()

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        """Start recording (``pool`` and ``capture_error_mode`` are accepted and unused:
        a graph's memory is its storages)."""
        if self._capturing or lazy.capturing():
            raise RuntimeError("a tpu graph capture is already open: end it before starting another")
        self.reset()
        lazy.flush()
        errors.raise_pending()
        self._before = {st: st.array for st in _unshared(_storages())}
        lazy.begin_capture()
        random_state.begin_capture()
        errors.hold_reads(True)
        self._capturing = True

    def capture_end(self, bind: bool = True) -> None:
        """Stop recording and bind the recording to memory (see the module docstring);
        ``bind=False`` drops it (a capture that raised)."""
        if not self._capturing:
            raise RuntimeError("TPUGraph.capture_end() without capture_begin()")
        self._capturing = False
        errors.hold_reads(False)
        keys, self._n_counters = random_state.end_capture()
        prog = lazy.end_capture()
        before, self._before = self._before, {}
        if prog is None or not prog.nodes:
            return
        # the recording's check flags: replay's to watch, never read as placeholders
        flags = errors.take_watched(lambda f: type(f) is Lazy and f.program is prog)
        try:
            if bind:
                self._bind(prog, before, keys, flags)
        finally:
            self._restore(prog, before)

    def _bind(self, prog: lazy.Program, before: dict, keys: list, watched: list) -> None:
        start: dict[int, tuple[Any, Storage]] = {}   # id(array) -> (array, its storage)
        for st, a in before.items():
            a = _value(a)
            if a is not None:
                start[id(a)] = (a, st)
        key_of = {id(k): (k, off) for k, off in keys}
        sources, reads, read_values, constants, key_offsets = [], [], [], [], []
        for v, aval in zip(prog.inputs, prog.input_avals):
            if aval in lazy_programs.PACKED:
                sources.append(("number", v))
            elif id(v) in key_of and key_of[id(v)][0] is v:
                sources.append(("key", len(key_offsets)))
                key_offsets.append(key_of[id(v)][1])
            elif id(v) in start and start[id(v)][0] is v:
                sources.append(("storage", len(reads)))
                reads.append(start[id(v)][1])
                read_values.append(v)
            else:
                sources.append(("constant", len(constants)))
                constants.append(v)
        slots: dict[tuple, int] = {}
        writes = []       # (storage, index of its new value among the program's results)
        avals = {}        # result index -> its shape and dtype
        for st in _storages():
            a = st.array
            if type(a) is Lazy and a.program is prog:
                j = slots.setdefault(a.slot, len(slots))
                writes.append((st, j))
                avals[j] = a.aval
        # a storage the block set to an array made outside the recording (a host copy):
        # each replay sets it again
        constant_writes = [(st, st.array) for st, a in before.items()
                           if st.array is not a and type(st.array) is not Lazy]
        flags = [(slots.setdefault(f.slot, len(slots)), op, checks) for f, op, checks in watched]
        packs = graph_packing.plan(reads, read_values, writes, avals, prog.index)
        self._all_reads = reads
        self._unpacked_k, reads, kept, writes, flags, sources = graph_packing.unpacked(
            packs, reads, writes, flags, sources, len(slots))
        written = {st for st, _ in writes}
        donated = tuple(k for k, st in enumerate(reads) if st in written)
        self._program = _Program(prog, sources, tuple(slots), donated, packs, kept)
        self._index, self._packs = prog.index, packs
        self._reads, self._writes, self._flags, self._donated = reads, writes, flags, donated
        self._constant_writes = constant_writes
        self._constants = constants
        self._key_offsets = np.array(key_offsets, np.int64)

    @staticmethod
    def _restore(prog: lazy.Program, before: dict) -> None:
        """Nothing ran: storages written in the block keep their old values, and what the
        block made holds zeros until the first replay."""
        for ref in prog.lazies:
            lz = ref()
            if lz is not None and lz.value is None:
                lz.value = jnp.zeros(lz.aval.shape, lz.aval.dtype)
        for st, a in before.items():
            if st.array is not a:
                st.array = a

    def replay(self) -> None:
        """Run the captured program once on the storages' current values."""
        if self._program is None:
            if self._capturing:
                raise RuntimeError("TPUGraph.replay() during its own capture")
            return
        # (a comprehension: a loop variable left holding the last array would count as
        # a holder below and cost that input a copy every replay)
        arrays = [lazy.concrete(st.array) if type(st.array) is Lazy else st.array for st in self._reads]
        for k in self._donated:
            # held by its storage, this list and getrefcount's argument only; else (a kept
            # ``.jax()``, a placeholder's value) the program gets a copy
            if sys.getrefcount(arrays[k]) > 3 or type(self._reads[k].array) is Lazy:
                arrays[k] = jnp.array(arrays[k], copy=True)
        keys = ()
        if len(self._key_offsets):
            seed, first = random_state.take(self._n_counters)
            keys = random_state.key_data(seed, first + self._key_offsets)
        buffers = [p.take() for p in graph_packing.reading(self._packs)]
        buffers, out = inflight.track(lazy_programs.run_on(
            self._index, self._program.jitted, [keys, self._constants, buffers, *arrays]))
        for p, b in zip(self._packs, buffers):
            p.publish(b)
        for st, a in self._constant_writes:
            st.array, st.version = a, st.version + 1
        for st, j in self._writes:
            st.array, st.version = out[j], st.version + 1
        for j, op, checks in self._flags:
            errors.watch(out[j], op, checks)

    def lower(self, arrays: list | None = None) -> jax.stages.Lowered:
        """The captured program lowered, not run, on ``arrays`` (by default the storages'
        current arrays; abstract values placed on a TPU chip compile it for that chip:
        ``tpu_kernels.aot.compile_lowered(lambda: g.lower(specs), "v5e")``)."""
        if self._program is None:
            raise RuntimeError("TPUGraph.lower(): nothing was captured")
        if arrays is None:
            arrays = [lazy.concrete(st.array) for st in self._all_reads]
        keys = np.zeros((len(self._key_offsets), 3), np.uint32) if len(self._key_offsets) else ()
        buffers = [graph_packing.buffer_spec(p, arrays) for p in graph_packing.reading(self._packs)]
        return self._program.jitted.lower(keys, self._constants, buffers, *(arrays[k] for k in self._unpacked_k))

    def input_specs(self) -> list[jax.ShapeDtypeStruct]:
        """Shape and dtype of each storage the program reads, in ``lower``'s order."""
        return [jax.ShapeDtypeStruct(st.array.shape, st.array.dtype) for st in self._all_reads]

    def reset(self) -> None:
        """Drop the captured program (and the memory it holds)."""
        self._program = None
        self._reads, self._writes, self._flags, self._constants = [], [], [], []
        self._all_reads, self._unpacked_k, self._packs = [], [], []
        self._constant_writes = []

    def pool(self) -> tuple[int, int]:
        """A handle for ``graph(pool=...)`` (memory is not pooled on tpu: accepted, unused)."""
        return (id(self), 0)


def graph_pool_handle() -> tuple[int, int]:
    """``torch.cuda.graph_pool_handle``'s counterpart (accepted, unused)."""
    return (0, 0)


@contextlib.contextmanager
def graph(tpu_graph: TPUGraph, pool: Any = None, stream: Any = None,
          capture_error_mode: str = "global") -> Iterator[TPUGraph]:
    """``with torch.tpu.graph(g):`` captures the block into ``g`` (``torch.cuda.graph``)."""
    tpu_graph.capture_begin(pool, capture_error_mode)
    try:
        yield tpu_graph
    except BaseException:
        tpu_graph.capture_end(bind=False)
        raise
    tpu_graph.capture_end()


def _capturable(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    if torch.compiler.is_compiling() or not lazy.capturing():
        return
    if any(g.get("capturable") is False for g in optimizer.param_groups):
        raise RuntimeError(
            f"Attempting tpu graph capture of step() for an instance of {type(optimizer).__name__} "
            "but param_groups' capturable is False: its step counts on the host, which a replay "
            "does not see. Pass capturable=True to the optimizer.")


def is_current_stream_capturing() -> bool:
    """Whether a ``torch.tpu.graph`` capture is recording (``torch.cuda``'s question: code
    that must not sync or allocate anew while captured asks it)."""
    return lazy.capturing()


_installed = False


def install() -> None:
    """Idempotent: ``torch.tpu.TPUGraph``, ``torch.tpu.graph``, ``torch.tpu.graph_pool_handle``,
    ``torch.tpu.is_current_stream_capturing`` and the optimizers' capturable check."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in ("TPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing"):
        setattr(torch.tpu, name, globals()[name])
    register_optimizer_step_pre_hook(_capturable)
