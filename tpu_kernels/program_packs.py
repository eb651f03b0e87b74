"""Packed optimizer state for compiled programs (``GraphProgram``): the small storages a
compiled graph both reads and writes and the model does not read (an optimizer's moments
and step counts) go into and out of its program as one flat buffer per dtype
(``graph_packing.Pack``, as a captured graph's state does) instead of one array each.

Why: a jit call's host cost grows with its results. On the TPU v5e host an output costs
~5.5 µs and an input ~1 µs (``bench/call_anatomy.py``); a compiled AdamW step over the
small GPT returns 116 arrays, 87 of them moments and step counts of a few KiB.

Members: inputs the graph writes (donated) that do not require grad (parameters: the
model's programs read them every step, and a member read outside its program cuts all of
them out of the buffer, one dispatch), of at most ``graph_packing.MAX_MEMBER_BYTES``,
single-device without a placement or links, each the one input over its storage, two or
more per dtype. Between calls a member holds a placeholder (``lazy.Lazy``) for its slice
of the last buffer: reading it (``state_dict()`` saved, an eager op) cuts the members out
then; writing it (``load_state_dict``) makes the next call pack the current values first.
A plan whose members were read or written between calls ``RETIRE_AFTER`` calls in a row
is dropped (the signature then runs unpacked: packing would only add dispatches).

How: planned at the first call of a signature, from a trace of the program that is not
compiled (which inputs it writes and where their new values leave), so only the packed
variant is compiled. The packed function is the program's own trace with the members cut
from the buffers before it and their new values joined after; one jit per program takes
the packs' layout as a static argument, so a plan made again for other storages of the
same shapes (a new optimizer's state) compiles nothing.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import sys
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import torch

from tpu_kernels import devices, errors, graph_packing, inflight, shadow
from tpu_kernels.graph_packing import MAX_MEMBER_BYTES, Pack
from tpu_kernels.lazy import Lazy, concrete
from tpu_kernels.storage import Storage

log = logging.getLogger(__name__)

# on where an output costs the host more than packing costs it per member: a TPU (see
# above; the small GPT's compiled step 4.06 -> 3.75 ms on a v5e), not the CPU backend
# (~1.5 µs an output: the same step 2.79 -> 3.03 ms, the members' placeholders and the
# concatenation costing more than the outputs saved). TPU_KERNELS_PACK_STATE=1/0 decides.
_SETTING = os.environ.get("TPU_KERNELS_PACK_STATE")
ON: bool | None = None if _SETTING is None else _SETTING not in ("", "0")


def enabled() -> bool:
    """Whether compiled programs pack their small state (the default: on a TPU only)."""
    global ON
    if ON is None:
        ON = devices.jax_devices()[0].platform == "tpu"
    return ON


RETIRE_AFTER = 3   # calls in a row whose members were read or written in between
MAX_PLANS = 4      # plans per signature (new storages each time) before it runs unpacked


class Packed:
    """One signature's packs: ``layout`` (static: per pack, the members' input positions,
    their result slots and avals), the ``Pack`` objects holding their storages, the other
    inputs (``rest``, the donated among them ``rest_donated``: positions in ``rest``) and
    the program's output layout without the members' write-backs (``result_layout``)."""

    def __init__(self, groups: list[list[tuple[int, int, Storage, Any]]], index: int,
                 n_inputs: int, donated: Sequence[int], layout: tuple, checks: list) -> None:
        self.layout = tuple((tuple(k for k, _, _, _ in g), tuple(j for _, j, _, _ in g),
                             tuple((tuple(a.shape), a.dtype) for _, _, _, a in g)) for g in groups)
        self.packs = [Pack([st for _, _, st, _ in g], [a for _, _, _, a in g], [k for k, _, _, _ in g],
                           [j for _, j, _, _ in g], index) for g in groups]
        for p in self.packs:
            p.caller, p.remedy = "a torch.compile'd graph", "torch._dynamo.reset() and compile again"
        self.storages = [(k, st) for g in groups for k, _, st, _ in g]
        self.positions = frozenset(k for k, _ in self.storages)
        self.slots = frozenset(j for g in groups for _, j, _, _ in g)
        self.rest = [k for k in range(n_inputs) if k not in self.positions]
        self.rest_donated = tuple(i for i, k in enumerate(self.rest) if k in donated)
        self.result_layout = ([(k, j) for k, j in layout[0] if k not in self.positions], layout[1])
        self.checks = checks   # (op, checks) per flag the program returns
        self.misses = 0      # calls in a row that found members read or written in between
        self.plans = 1       # plans made for the signature (its storages changed)

    def fits(self, sources: Sequence[tuple]) -> bool:
        """Whether a call's inputs are the planned storages."""
        return all(sources[k][0] is st for k, st in self.storages)

    def take(self) -> list[jax.Array] | None:
        """The packs' buffers for a call (each pack's members' current values), or None
        once the members were touched between ``RETIRE_AFTER`` calls in a row."""
        buffers = [p.take() for p in self.packs]
        self.misses = self.misses + 1 if any(p.touched for p in self.packs) else 0
        if self.misses > RETIRE_AFTER:
            self.publish(buffers)   # (back: the storages' placeholders stand for them)
            return None
        return buffers

    def publish(self, buffers: Sequence[jax.Array]) -> None:
        for p, b in zip(self.packs, buffers):
            p.publish(b)


def plan(outputs: tuple, donated: Sequence[int], tensors: Sequence[Any],
         sources: Sequence[tuple]) -> Packed | None:
    """The packs of a call (``outputs``: the program's (output layout, flag checks), the
    layout's first part (input position, result slot) of each input the graph writes;
    ``tensors``: the call's tensor inputs, ``sources`` their (storage, geometry)), or None
    where fewer than two members of a dtype qualify. (A program on one device: see
    ``GraphProgram``'s ``_init_packs``.)"""
    layout, checks = outputs
    written = layout[0]
    count: dict[int, int] = {}
    for st, _ in sources:
        count[id(st)] = count.get(id(st), 0) + 1
    donated = set(donated)
    groups: dict[Any, list] = {}
    for k, j in written:
        st = sources[k][0]
        if k in donated and count[id(st)] == 1 and _member(tensors[k], st):
            a = jax.ShapeDtypeStruct(tuple(st.array.shape), st.array.dtype)
            groups.setdefault(a.dtype, []).append((k, j, st, a))
    groups = [g for g in groups.values() if len(g) > 1]
    if not groups:
        return None
    return Packed(groups, groups[0][0][2].index, len(sources), donated, layout, checks)


def _member(t: Any, st: Storage) -> bool:
    owner = shadow.owner(t) if type(t) is torch.Tensor else t   # (AOTAutograd passes shadows)
    if owner is None or owner.requires_grad or isinstance(owner, torch.nn.Parameter):
        return False
    a = st.array
    return (st.placement is None and st.links is None and isinstance(a, jax.Array)
            and len(a.devices()) == 1 and math.prod(a.shape) * a.dtype.itemsize <= MAX_MEMBER_BYTES)


def packed_function(trace: Callable) -> Callable:
    """``trace`` (a program's ``(statics, key, *arrays) -> (results, flags)``) over packs:
    ``(statics, layout, key, buffers, *rest)`` -> (the packs' new buffers, the results with
    the members' left out (None), flags); ``rest``: the inputs that are no member's."""
    def run(statics: tuple, layout: tuple, key: Any, buffers: list, *rest: Any) -> tuple:
        arrays: list[Any] = [None] * (len(rest) + sum(len(ks) for ks, _, _ in layout))
        for (ks, _, avals), buffer in zip(layout, buffers):
            for k, v in zip(ks, graph_packing.split(buffer, [jax.ShapeDtypeStruct(*a) for a in avals])):
                arrays[k] = v
        it = iter(rest)
        results, flags = trace(statics, key, *(next(it) if a is None else a for a in arrays))
        joined = []
        for _, slots, avals in layout:
            values = [results[j] for j in slots]
            if [(tuple(v.shape), v.dtype) for v in values] != list(avals):
                raise Unpackable()
            joined.append(graph_packing.join(values))
        packed = {j for _, slots, _ in layout for j in slots}
        return joined, [None if j in packed else r for j, r in enumerate(results)], flags
    return run


class Unpackable(Exception):
    """A member's new value has another shape or dtype than its old one (raised while
    tracing: nothing ran)."""


class PackedCalls:
    """What a ``GraphProgram`` does to run a signature with its state packed. It uses the
    program's ``donated``, ``is_tensor``, ``all_tensors``, ``n_random``, ``_outputs``,
    ``_jitted``, ``arguments``, ``_trace``, ``_key`` and ``_results``."""

    def _init_packs(self, packable: bool) -> None:
        self._packable = packable
        self._packs: dict[tuple, Packed | None] = {}   # statics -> its plan (None: unpacked)
        self._packed_jits: dict[tuple, Any] = {}       # donated positions in rest -> jitted

    def run_unpacked(self) -> None:
        """Never pack (a program run once, as SGD's first step: its placeholders would only
        make the next program's plan fail)."""
        self._packable = False

    def _run_packed(self, args: tuple, sources: list, statics: tuple) -> list[Any] | None:
        """The call with the small state it writes packed, or None where this signature
        has no packs (none qualify, a plan was dropped, or its trace failed)."""
        pk = self._packs.get(statics, _UNPLANNED)
        if pk is _UNPLANNED or (pk is not None and not pk.fits(sources)):
            if statics not in self._outputs and not self._trace_only(statics, sources):
                return None
            pk = self._packs[statics] = self._plan(args, sources, statics, None if pk is _UNPLANNED else pk)
        if pk is None:
            return None
        buffers = pk.take()
        if buffers is None:
            log.info("a compiled graph's packed state was read or written between its calls "
                     "%d times in a row: it runs unpacked from now on", RETIRE_AFTER + 1)
            self._packs[statics] = None
            return None
        rest = [sources[k][0].array for k in pk.rest]
        rest = [concrete(a) if type(a) is Lazy else a for a in rest]
        own_donated(rest, [sources[pk.rest[i]][0] for i in pk.rest_donated], pk.rest_donated)
        key = self._key(self.n_random)
        try:
            buffers, results, flags = self._packed_jit(pk.rest_donated)(statics, pk.layout, key, buffers, *rest)
        except Unpackable:     # (raised while tracing: nothing was donated)
            pk.publish(buffers)
            self._packs[statics] = None
            return None
        except Exception:
            pk.publish(buffers)     # (a trace that failed gave nothing away)
            raise
        pk.publish(buffers)
        results, flags = inflight.track((results, flags))
        for f, (op, c) in zip(flags, pk.checks):
            errors.watch(f, op, c)
        return self._results(pk.result_layout, sources, results)

    def _trace_only(self, statics: tuple, sources: list) -> bool:
        """Trace a new signature without compiling it (which inputs it writes, where
        their new values leave: what a plan needs), so that only its packed variant is
        compiled; False where the trace failed (the unpacked call then raises or copes)."""
        specs = [jax.ShapeDtypeStruct(tuple(st.array.shape), st.array.dtype) for st, _ in sources]
        try:
            self._jitted.trace(statics, jax.ShapeDtypeStruct((3,), jnp.uint32), *self.arguments(specs))
        except Exception:   # noqa: BLE001 (the call made next meets it again, and reports it)
            return False
        return statics in self._outputs

    def _plan(self, args: tuple, sources: list, statics: tuple, old: Packed | None) -> Packed | None:
        if old is not None and old.plans >= MAX_PLANS:
            return None     # (its storages keep changing: a plan would not last)
        tensors = args if self.all_tensors else [a for a, t in zip(args, self.is_tensor) if t]
        pk = plan(self._outputs[statics], self.donated, tensors, sources)
        if pk is not None and old is not None:
            pk.plans = old.plans + 1
        return pk

    def _packed_jit(self, donated: tuple) -> Any:
        jitted = self._packed_jits.get(donated)
        if jitted is None:
            trace = packed_function(functools.partial(self._trace, count=False))
            jitted = self._packed_jits[donated] = jax.jit(
                trace, static_argnums=(0, 1), donate_argnums=(3, *(4 + i for i in donated)))
        return jitted


_UNPLANNED = object()


def own_donated(arrays: list, storages: list[Storage], donated: Sequence[int]) -> None:
    """Give a program a copy of each donated array in ``arrays`` (positions ``donated``;
    ``storages``: theirs, in that order) that something besides its storage holds."""
    for k, st in zip(donated, storages):
        # held by its storage, this list and getrefcount's argument only: else (a
        # ``.jax()`` kept, a storage sharing the array, a deferred placeholder's value)
        # the program gets a copy
        if sys.getrefcount(arrays[k]) > 3 or type(st.array) is Lazy:
            arrays[k] = jnp.array(arrays[k], copy=True)
