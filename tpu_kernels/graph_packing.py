"""Packed state for captured graphs (``graphs.py``): the storages a replay both reads and
writes (parameters, optimizer moments and step counts) travel as one flat buffer per
dtype instead of one array each.

Why: a jit call's host cost grows with its arguments and, mostly, with its results. On
the TPU v5e host of ``bench/call_anatomy.py`` a call costs ~110 µs, plus ~1 µs an input
and ~5.5 µs an output; the small GPT's captured training step read 117 arrays and wrote
148, most of them parameters, moments and step counts of a few KiB.

How: the program takes one buffer per pack, cuts the members out of it (free inside
XLA) and returns their new values joined into a new buffer, which the next replay is
given (donated) if every member storage still holds the placeholder it was left with: a
``lazy.Lazy`` whose source is the pack. Nothing is cut out between replays unless
something reads a member (``.item()``, an eager op, ``state_dict()``); then one dispatch
cuts out all of them. A member written in between (``p.data.copy_(...)``) makes the next
replay pack the members' current values first (one dispatch).

Storages the program writes without reading them (the gradients a step with
``zero_grad()`` in it makes anew) are packed too, in packs of their own that are
results only: no buffer goes in, one comes out. A scalar is left out of those (a loss
read every step would cost a cut each time).

Members: single-device storages without a placement or links, read and written by the
program with one shape and dtype (or only written), of at most ``MAX_MEMBER_BYTES`` (a
larger array's output costs the host less than cutting it out of the buffer and joining
it back costs the chip), two or more per dtype.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from tpu_kernels import lazy, lazy_programs
from tpu_kernels.lazy import Lazy
from tpu_kernels.storage import Storage

# Measured on a TPU v5e (bench/results/tpu_v5e/2026-12-05-s25.md): packing the small GPT's
# state (members up to 64 KiB) made its replay 1.6x faster; packing the medium GPT's with
# members up to 1 MiB (41 MB in all) made it 15% slower, the chip cutting and joining
# tiled 2-D arrays costing more than the outputs it saved. Results-only packs (session 26,
# 2026-12-05-s26.md): the small GPT's step 0.616 -> 0.430 ms, the medium one's unchanged
MAX_MEMBER_BYTES = 64 << 10


class Pack:
    """Storages of one dtype that a replay reads and writes through one flat buffer.
    ``reads``/``slots``: each member's position among the program's reads and results."""

    def __init__(self, storages: list[Storage], avals: list[Any], reads: list[int],
                 slots: list[int], index: int) -> None:
        self.storages, self.avals, self.reads, self.slots = storages, avals, reads, slots
        self.index = index   # the tpu device (a placeholder's ``index``)
        sizes = [math.prod(a.shape) for a in avals]
        self.spec = jax.ShapeDtypeStruct((sum(sizes),), avals[0].dtype)
        # who packs it, and what to do when a member changed shape (in errors)
        self.caller, self.remedy = "TPUGraph.replay()", "capture the graph again"
        self.buffer: jax.Array | None = None      # the last replay's, until the next takes it
        self.members: list[Lazy] = []             # the placeholders it left in the storages
        self.touched = True     # (``take``'s: a member was read or written since the last replay)
        self._join = jax.jit(lambda *values: self.join(values))
        self._split = jax.jit(self.split)

    # -- inside the program (traced values) -----------------------------------------------
    def split(self, buffer: jax.Array) -> list[jax.Array]:
        return split(buffer, self.avals)

    def join(self, values: Sequence[jax.Array]) -> jax.Array:
        return join(values)

    # -- on the host --------------------------------------------------------------------
    def take(self) -> jax.Array:
        """The members' current values as one buffer, for a replay to consume (donate).
        ``touched`` then says whether a member was read or written since the last replay."""
        intact, self.touched, held = self._survey()
        if held:
            # a placeholder held beyond its storage gets its value before the buffer it
            # would be cut from is given away
            self.fill(self.members[0])
        buffer = self.buffer if intact else self._pack_now()   # (cuts out unread members first)
        self.buffer = None
        if self.touched or held:
            self.members = []     # (else ``publish`` keeps them: nobody else has one)
        return buffer

    def _survey(self) -> tuple[bool, bool, bool]:
        """One pass over the members: (intact, touched, held): every member storage still
        holds the placeholder the last replay left it; a member was read or written since;
        an unread placeholder is held beyond its storage (a recording, a variable)."""
        members = self.members
        if self.buffer is None or len(members) != len(self.storages):
            return False, True, False
        intact, read, held = True, False, False
        for st, lz in zip(self.storages, members):
            kept = st.array is lz
            intact = intact and kept
            if lz.value is not None:
                read = True
            # held by its storage (if kept), the list, zip's reused tuple, the loop's
            # variable and getrefcount's argument: anything more is a holder
            elif sys.getrefcount(lz) > 4 + kept:
                held = True
        return intact, read or not intact, held

    def _pack_now(self) -> jax.Array:
        values = [lazy.concrete(st.array) for st in self.storages]
        for st, v, a in zip(self.storages, values, self.avals):
            if (tuple(v.shape), v.dtype) != (tuple(a.shape), a.dtype):
                raise RuntimeError(
                    f"{self.caller}: a tensor the graph reads and writes is now {v.dtype}"
                    f"{list(v.shape)}, captured as {a.dtype}{list(a.shape)}: {self.remedy}")
        return lazy_programs.run_on(self.index, self._join, values)

    def publish(self, buffer: jax.Array) -> None:
        """A replay's new buffer: each member storage gets a placeholder for its slice.
        Placeholders nobody read, wrote over or holds stand for the new buffer as they
        are (the storages' versions still move on); the others are replaced."""
        if self.members and not self.reads:   # results only: no ``take`` looked at them
            _, touched, held = self._survey()
            if held:
                self.fill(self.members[0])   # (held elsewhere: they keep this replay's values)
            if touched or held:
                self.members = []
        self.buffer = buffer
        if self.members:
            for st in self.storages:
                st.version += 1
            return
        self.members = [Lazy(a, self, i) for i, a in enumerate(self.avals)]
        for st, lz in zip(self.storages, self.members):
            st.array, st.version = lz, st.version + 1

    def fill(self, placeholder: Lazy) -> None:
        """Cut every member out of the buffer (``lazy.concrete`` of a member's placeholder)."""
        if self.buffer is None or not any(lz is placeholder for lz in self.members):
            raise RuntimeError("internal: a packed graph value was read after its replay's "
                               "buffer was given to the next replay")
        for lz, value in zip(self.members, lazy_programs.run_on(self.index, self._split, [self.buffer])):
            if lz.value is None:
                # (no longer tied to the pack: a storage keeping it keeps no buffer alive)
                lz.value, lz.program = value, None


def split(buffer: jax.Array, avals: Sequence[Any]) -> list[jax.Array]:
    """The members (shapes and dtypes ``avals``, in order) cut from a pack's ``buffer``
    (inside a program: free for XLA)."""
    out, start = [], 0
    for a in avals:
        n = math.prod(a.shape)
        out.append(buffer[start:start + n].reshape(a.shape))
        start += n
    return out


def join(values: Sequence[jax.Array]) -> jax.Array:
    """The members' values as one flat buffer."""
    return jnp.concatenate([jnp.ravel(v) for v in values])


def plan(reads: list[Storage], values: list[Any], writes: list[tuple[Storage, int]],
         avals: dict[int, Any], index: int) -> list[Pack]:
    """The packs of a captured program: its storages read (``values``: the arrays read)
    and written (``writes``: (storage, result slot); ``avals``: each slot's shape and
    dtype) that qualify; the packs with reads first, then the results-only ones."""
    slot_of = {id(st): j for st, j in writes}
    read_ids = {id(st) for st in reads}
    groups: dict[Any, list[tuple[Storage, int, int]]] = {}
    for k, (st, v) in enumerate(zip(reads, values)):
        j = slot_of.get(id(st))
        if j is not None and _packable(st, avals[j], v):
            groups.setdefault(avals[j].dtype, []).append((st, k, j))
    results_only: dict[Any, list[tuple[Storage, int, int]]] = {}
    for st, j in writes:
        if id(st) not in read_ids and avals[j].shape and _packable(st, avals[j]):
            results_only.setdefault(avals[j].dtype, []).append((st, -1, j))
    return [Pack([st for st, _, _ in g], [avals[j] for _, _, j in g], [k for _, k, _ in g if k >= 0],
                 [j for _, _, j in g], index)
            for g in [*groups.values(), *results_only.values()] if len(g) > 1]


def _packable(st: Storage, aval: Any, a: Any = None) -> bool:
    """``a``: the array a read member holds now (None for a storage only written)."""
    if a is not None and not (isinstance(a, jax.Array) and len(a.devices()) == 1
                              and (tuple(a.shape), a.dtype) == (tuple(aval.shape), aval.dtype)):
        return False
    return (st.placement is None and st.links is None
            and math.prod(aval.shape) * aval.dtype.itemsize <= MAX_MEMBER_BYTES)


def unpacked(packs: list[Pack], reads: list[Storage], writes: list[tuple[Storage, int]],
             flags: list[tuple], sources: list[tuple], n_results: int) -> tuple:
    """The program's plan with the packs taken out: (original positions of the reads left,
    those reads, the results left (returned as they are), writes and flags re-indexed into
    them, sources with packed reads as ``("packed", (pack, member))``)."""
    member = {k: (g, i) for g, p in enumerate(packs) for i, k in enumerate(p.reads)}
    left = [k for k in range(len(reads)) if k not in member]
    new_k = {k: n for n, k in enumerate(left)}
    packed_slots = {j for p in packs for j in p.slots}
    kept = [j for j in range(n_results) if j not in packed_slots]
    new_j = {j: n for n, j in enumerate(kept)}
    sources = [("packed", member[v]) if kind == "storage" and v in member
               else ("storage", new_k[v]) if kind == "storage" else (kind, v) for kind, v in sources]
    writes = [(st, new_j[j]) for st, j in writes if j in new_j]
    flags = [(new_j[j], op, checks) for j, op, checks in flags]
    return left, [reads[k] for k in left], kept, writes, flags, sources


def reading(packs: list[Pack]) -> list[Pack]:
    """The packs whose buffer the program takes (``plan`` puts them first)."""
    return [p for p in packs if p.reads]


def buffer_spec(pack: Pack, arrays: Sequence[Any]) -> jax.ShapeDtypeStruct:
    """The abstract buffer of ``pack`` for lowering on ``arrays`` (every read, in capture
    order; abstract values placed on a chip place the buffer there too)."""
    return jax.ShapeDtypeStruct(pack.spec.shape, pack.spec.dtype,
                                sharding=getattr(arrays[pack.reads[0]], "sharding", None))
