"""Lazy values: record jittable functions, run each recorded stretch as one jitted program.

The machinery under deferred mode (``deferred_mode.py``). While ``recording()``, a call
``record(fn, *args)`` does not run: it appends ``fn`` to the current ``Program`` and
returns ``Lazy`` placeholders with the result's shape and dtype; ``apply`` records or
runs, whichever applies. A recording runs ("is flushed") when a value is needed
(``concrete(v)``: ``.item()``, ``.cpu()``, printing, an op whose result shape depends on
data, the CPU fallback), when it reaches ``MAX_NODES`` functions, and at ``flush()``. A
flush replays the recorded functions inside one ``jax.jit`` so XLA fuses across them;
programs are cached by their structure (which functions, wired how, on which shapes), so
a training loop compiles once.

With several tpu devices a recording holds one device's ops: an op on another device
flushes it first, and the program runs on its device (``Program.index``).

It sits under the storage layer: reading a view of a parameter is recorded too, so it
fuses into the program that uses it.
"""
from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Any, Callable, Iterator

import jax
import numpy as np

from tpu_kernels import devices, inflight, memory
from tpu_kernels.lazy_programs import packed, replay, run_on
from tpu_kernels.lru import LRU

MAX_NODES = int(os.environ.get("TPU_KERNELS_DEFERRED_MAX_OPS", "4096"))
# a recording started by ``record_until_flush`` (not by deferred mode) runs once it is
# this long: eager code after a compiled step's programs is recorded only briefly
UNTIL_FLUSH_MAX_NODES = 64


class Lazy:
    """A value a recorded op will produce: its shape and dtype, its program until the
    flush, and (after the flush) it. ``program`` is whatever can ``fill`` it: a
    recording, or a captured graph's pack (``graph_packing.Pack``, ``slot`` its member)."""
    __slots__ = ("aval", "value", "program", "slot", "index", "__weakref__")

    def __init__(self, aval: jax.ShapeDtypeStruct, program: "Program", slot: tuple) -> None:
        self.aval, self.value, self.program, self.slot = aval, None, program, slot
        self.index = program.index

    def devices(self) -> set:
        """The device it will be on (as ``jax.Array.devices``): its program's."""
        return {devices.jax_devices()[self.index]}

    shape = property(lambda self: self.aval.shape)
    dtype = property(lambda self: self.aval.dtype)
    ndim = property(lambda self: len(self.aval.shape))

    @property
    def size(self) -> int:
        n = 1
        for d in self.aval.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self.aval.dtype.itemsize

    def __array__(self, dtype=None, copy=None):
        return np.asarray(concrete(self), dtype=dtype)


class Program:
    """One recording: nodes (function, argument references) and the program's inputs.

    A reference is an int (the index of an input) or a (node, output) pair. The nodes
    and the inputs' shapes are kept as the recording grows, so at a flush the program's
    structure is ready to look up (no walk over the nodes)."""

    def __init__(self, index: int = 0) -> None:
        self.index = index   # the tpu device it runs on
        self.nodes: list[tuple[Callable, tuple]] = []
        self.inputs: list[Any] = []
        self.input_avals: list[Any] = []
        self._input_ids: dict[int, int] = {}
        self.lazies: list[weakref.ref] = []
        self.watchers: list[Callable[[bool], None]] = []   # told at the flush: compiled anew?

    def fill(self, placeholder: Lazy) -> None:
        """Give ``placeholder`` (one of this recording's) its value: run the recording.
        (A placeholder's source may be something else with a ``fill``: a captured
        graph's packed state, ``graph_packing.py``.)"""
        flush()

    def refs(self, args: tuple) -> tuple:
        """The references of ``args``, new inputs added."""
        refs = []
        ids, inputs, avals = self._input_ids, self.inputs, self.input_avals
        for v in args:
            if type(v) is Lazy:
                if v.value is None:
                    if v.program is self:
                        refs.append(v.slot)
                        continue
                    v = concrete(v)
                else:
                    v = v.value
            array = isinstance(v, (jax.Array, np.ndarray))
            i = ids.get(id(v)) if array else None
            if i is None:
                i = ids[id(v)] = len(inputs)
                inputs.append(v)
                avals.append(_aval_key(v))
            refs.append(i)
        return tuple(refs)


_AVALS: dict[Any, tuple] = {}    # (fn, arg avals) -> (output avals, treedef)
_PROGRAMS = LRU(int(os.environ.get("TPU_KERNELS_DEFERRED_CACHE_SIZE", "256")))


def _clear_caches() -> None:
    _AVALS.clear()      # its functions hold their executables
    _PROGRAMS.clear()


memory.on_empty_cache(_clear_caches)

_lock = threading.RLock()


class _State:
    def __init__(self) -> None:
        self.depth = 1 if os.environ.get("TPU_KERNELS_DEFERRED", "") not in ("", "0") else 0
        self.program: Program | None = None
        self.flushes = 0
        self.compiles = 0
        self.until_flush = False   # recording started by ``record_until_flush``
        self.paused = 0            # ``paused()`` blocks entered (a compiled graph being traced)
        self.capturing = False     # a graph capture's recording (``begin_capture``) is open


_STATE = _State()


def recording() -> bool:
    return _STATE.depth > 0 and not _STATE.paused


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Ops run, not recorded, within the block: a compiled graph traced while a recording
    is open dispatches its ops onto the trace's values."""
    _STATE.paused += 1
    try:
        yield
    finally:
        _STATE.paused -= 1


class CaptureError(RuntimeError):
    """A value was needed while a graph was being captured (``graphs.py``)."""


def capturing() -> bool:
    return _STATE.capturing


def begin_capture() -> None:
    """Record everything from now on into one program that never runs by itself: no
    length limit, no stage boundaries, and a flush (a value read) raises ``CaptureError``."""
    flush()
    with _lock:
        _STATE.capturing = True
        _STATE.depth += 1


def end_capture() -> Program | None:
    """End the capture; its recording (None if nothing was recorded), taken out unrun."""
    with _lock:
        prog, _STATE.program = _STATE.program, None
        _STATE.capturing = False
        _STATE.depth -= 1
    return prog


def start_recording() -> None:
    """Record from now on (nests: each start needs its ``stop_recording``)."""
    _STATE.depth += 1


def stop_recording() -> None:
    """End one ``start_recording``; what was recorded runs at the next flush."""
    _STATE.depth -= 1


def record_until_flush() -> None:
    """Record from now on until the next flush (once, however often called): a compiled
    training step's programs are recorded (``compile_step.py``), and the eager ops on
    their outputs (a loss computed eagerly, backward's seed gradient) join them."""
    with _lock:
        if not _STATE.until_flush:
            _STATE.until_flush = True
            _STATE.depth += 1


def _aval(v: Any) -> Any:
    if type(v) is Lazy:
        return v.aval
    if isinstance(v, (jax.Array, np.ndarray)):
        return jax.ShapeDtypeStruct(v.shape, v.dtype)
    return v  # Python scalars: traced weakly typed, keyed by value type below


def _aval_key(v: Any) -> Any:
    if type(v) is Lazy:
        return v.aval.shape, v.aval.dtype
    if isinstance(v, (jax.Array, np.ndarray)):
        return v.shape, v.dtype
    return type(v)


def _device_of(args: tuple) -> int:
    """The tpu device an op on ``args`` runs on: its first placed input's (a Lazy's or a
    committed array's; a host scalar's copy is uncommitted and goes anywhere), else JAX's
    default device (a factory on ``tpu:i`` runs under ``jax.default_device``)."""
    for a in args:
        if type(a) is Lazy:
            return a.index
        if isinstance(a, jax.Array) and a.committed:
            return devices.index_of_array(a)
    d = jax.config.jax_default_device
    return 0 if d is None else devices.index_of_device(d)


def out_spec(fn: Callable, args: Any, keys: tuple | None = None) -> tuple:
    """(output avals, treedef) of ``fn(*args)``, worked out once per function and argument
    shapes (``keys``: the arguments' ``_aval_key``s, if known); a caller that knows it
    already passes it to ``record``."""
    key = (fn, tuple(_aval_key(a) for a in args) if keys is None else keys)
    hit = _AVALS.get(key)
    if hit is None:
        out = jax.eval_shape(fn, *(_aval(a) for a in args))
        hit = _AVALS[key] = jax.tree.flatten(out)
    return hit


def record(fn: Callable, *args: Any, spec: tuple | None = None,
           watcher: Callable[[bool], None] | None = None) -> Any:
    """Record ``fn(*args)`` (``fn`` jittable); returns its result as Lazy placeholders.
    ``spec``: its ``out_spec``, when the caller knows it; ``watcher(compiled)`` is called
    when the recording runs, with whether its program had to be compiled."""
    if spec is None:
        spec = out_spec(fn, args)
    return jax.tree.unflatten(spec[1], record_leaves(fn, args, spec[0], watcher))


def record_leaves(fn: Callable, args: Any, leaves: list,
                  watcher: Callable[[bool], None] | None = None) -> list[Lazy]:
    """``record`` for a caller that knows ``fn``'s output leaves (``out_spec(fn, args)[0]``):
    the placeholders of the leaves, in order (the dispatcher's hot path builds its result
    from them, without the tree)."""
    with _lock:
        index = _device_of(args) if devices.several else 0
        prog = _STATE.program
        if prog is not None and prog.index != index:   # one device's ops per program
            flush()
            prog = None
        if prog is None:
            prog = _STATE.program = Program(index)
        refs = prog.refs(args)
        if watcher is not None and watcher not in prog.watchers:   # told once a flush
            prog.watchers.append(watcher)
        node = len(prog.nodes)
        prog.nodes.append((fn, refs))
        outs = []
        lazies = prog.lazies
        for j, aval in enumerate(leaves):
            lazy = Lazy(aval, prog, (node, j))
            lazies.append(weakref.ref(lazy))
            outs.append(lazy)
        full = node + 1 >= (UNTIL_FLUSH_MAX_NODES if _STATE.until_flush and _STATE.depth == 1 else MAX_NODES)
    if full and not _STATE.capturing:
        flush()
    return outs


def apply(fn: Callable, *args: Any) -> Any:
    """``fn(*args)``: recorded when the mode is on (so a view read of a parameter fuses
    into the program that uses it), else run now."""
    if recording():
        return record(fn, *args)
    return inflight.track(fn(*(concrete(a) if type(a) is Lazy else a for a in args)))


def concrete(v: Any) -> Any:
    """The concrete value of ``v`` (running its recording if it has not run yet)."""
    if type(v) is not Lazy:
        return v
    if v.value is None:
        v.program.fill(v)
    return v.value


def stage_boundary() -> None:
    """A training step's next stage begins (a backward, an optimizer step): deferred mode
    runs what it has recorded now, so XLA runs one stage while Python records the next.
    The stages' programs are cached as one program is, and a recording started by
    ``record_until_flush`` alone is left to its own flush."""
    if (_STATE.program is not None and _STATE.depth > _STATE.until_flush and not _STATE.paused
            and not _STATE.capturing):
        flush()


def flush() -> None:
    """Run the current recording as one jitted program and fill its live placeholders."""
    if _STATE.capturing and _STATE.program is not None:
        raise CaptureError(
            "a tpu value was needed while a graph was being captured (.item(), .cpu(), printing, "
            "an op whose result shape depends on data, or a CPU fallback): a captured graph "
            "does not run until replay(); move the read out of the capture (torch.cuda raises "
            "'operation not permitted when stream is capturing' here)")
    with _lock:
        prog, _STATE.program = _STATE.program, None
        if _STATE.until_flush:
            _STATE.until_flush = False
            _STATE.depth -= 1
    if prog is None or not prog.nodes:
        return
    live = [lz for lz in [r() for r in prog.lazies] if lz is not None]
    wanted = tuple([lz.slot for lz in live])
    key = (tuple(prog.nodes), wanted, tuple(prog.input_avals))
    run = _PROGRAMS.get(key)
    for watcher in prog.watchers:
        watcher(run is None)
    if run is None:
        run = _PROGRAMS.put(key, jax.jit(replay(prog.nodes, wanted, prog.input_avals)))
        _STATE.compiles += 1
    values = inflight.track(run_on(prog.index, run, packed(prog.inputs, prog.input_avals)))
    for lz, val in zip(live, values):
        # a placeholder outlives its flush (a parameter's array, an unread check flag):
        # it must not keep the program, and with it every input of the step, alive
        lz.value, lz.program = val, None
    _STATE.flushes += 1


def stats() -> dict[str, int]:
    """Flushes run and programs compiled since start (a loop should compile once)."""
    return {"flushes": _STATE.flushes, "compiles": _STATE.compiles, "cached": _PROGRAMS.info().size}
