"""The collectives in a compiled SPMD program, read from its optimised HLO text.

Each collective (all-gather, all-reduce, reduce-scatter, all-to-all, collective-permute) is
counted once, with the bytes of its result. XLA:TPU writes an asynchronous collective in
one of three forms, all read here as a start, the instructions scheduled while it is in
flight, and a done:

- ``all-gather-start`` / ``all-gather-done`` (and the other kinds'): XLA's async pairs;
- ``async-start`` / ``async-update`` / ``async-done`` wrapping a collective computation;
- libtpu's *async collective fusion*: a fusion whose root is the custom call
  ``AsyncCollectiveStart`` around the collective, *continuation* fusions that take the
  start's in-flight buffers and fuse compute with the collective's steps (the collective
  appears again in their bodies: one collective, not several), and a fusion rooted at
  ``AsyncCollectiveDone``. A chain is followed through the values it passes on
  (get-tuple-element, continuations) from its start to its done; a continuation in a loop
  body (XLA's windowed einsums carry a chain of the enclosing computation through their
  loop) belongs to the chain its start opened, and the loop counts as compute beside it.

A collective with compute (a fusion that computes, a dot, a convolution, a custom call, a
loop) scheduled between its start and done *overlaps*; a synchronous collective, or a
pair with nothing between, does not. Only the computations the program runs in order
(the entry, loop bodies, called computations) are walked; a collective inside a plain
fusion (e.g. a reduce-scatter written as an all-reduce and a slice) is synchronous.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
         "ragged-all-to-all")
_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%(?P<name>[\w.-]+)\s*\(.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.-]+)\s*=\s*(?P<type>.+?)\s+"
                    r"(?P<op>[a-z][\w-]*)\((?P<operands>[^)]*)\)(?P<rest>.*)$")
_ARRAY = re.compile(r"\b(?P<dtype>pred|s\d+|u\d+|f\d+|bf16|f8\w*|c\d+)\[(?P<dims>[\d,]*)\]")
_REF = re.compile(r"%([\w.-]+)")
_CALLS = re.compile(r"\bcalls=%([\w.-]+)")
_TARGET = re.compile(r'custom_call_target="(\w+)"')
# computations a scheduled instruction runs in order (loops, calls, conditionals)
_SUBPROGRAMS = re.compile(r"\b(?:body|condition|to_apply|true_computation|false_computation)"
                          r"=%([\w.-]+)|branch_computations=\{([^}]*)\}")
_COMPUTE = ("fusion", "convolution", "dot", "custom-call", "while", "call", "conditional")
_PLUMBING = ("parameter", "tuple", "get-tuple-element", "bitcast", "constant")
_START, _DONE = "AsyncCollectiveStart", "AsyncCollectiveDone"
_MOVES = (_START, _DONE, "ConcatBitcast")    # custom calls that only mark or move buffers
_BITS = {"pred": 8, "bf16": 16}


def _bytes(type_text: str) -> list[int]:
    out = []
    for m in _ARRAY.finditer(type_text):
        dt = m.group("dtype")
        bits = _BITS.get(dt) or int(re.sub(r"\D", "", dt) or 8)
        dims = [int(d) for d in m.group("dims").split(",") if d]
        out.append(int(np.prod(dims, dtype=np.int64)) * bits // 8)
    return out


@dataclasses.dataclass
class Collective:
    kind: str
    bytes: int
    overlapped: bool
    asynchronous: bool = True        # a start/done pair (False: one synchronous op)


@dataclasses.dataclass
class Report:
    collectives: list[Collective]

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """kind -> (count, bytes)."""
        out: dict[str, tuple[int, int]] = {}
        for c in self.collectives:
            n, b = out.get(c.kind, (0, 0))
            out[c.kind] = (n + 1, b + c.bytes)
        return out

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.collectives)

    @property
    def overlapped_bytes(self) -> int:
        """The collective bytes in flight while compute runs."""
        return sum(c.bytes for c in self.collectives if c.overlapped)

    @property
    def overlapped_fraction(self) -> float:
        """Of the collective bytes, the fraction in flight while compute runs."""
        total = self.total_bytes
        return self.overlapped_bytes / total if total else 0.0

    def overlap_by_kind(self) -> dict[str, dict[str, int]]:
        """kind -> bytes overlapped, bytes async with no compute in flight, bytes
        synchronous: where the bytes that do not overlap come from."""
        out: dict[str, dict[str, int]] = {}
        for c in self.collectives:
            row = out.setdefault(c.kind, dict(overlapped=0, async_idle=0, synchronous=0))
            key = ("overlapped" if c.overlapped else "async_idle" if c.asynchronous
                   else "synchronous")
            row[key] += c.bytes
        return out

    def format(self, indent: str = "") -> str:
        mib = 1 / 2**20
        parts = [f"{k} {n} ({b * mib:,.1f} MiB)" for k, (n, b) in sorted(self.by_kind().items())]
        return (f"{indent}collectives per chip: {', '.join(parts) or 'none'}; "
                f"{self.total_bytes * mib:,.1f} MiB in all, "
                f"{self.overlapped_fraction:.0%} of the bytes overlap compute (async pairs)")


@dataclasses.dataclass
class _Instr:
    name: str
    op: str
    type: str
    operands: list[str]
    rest: str

    @property
    def calls(self) -> str | None:
        m = _CALLS.search(self.rest)
        return m.group(1) if m else None

    @property
    def target(self) -> str | None:
        m = _TARGET.search(self.rest) if self.op == "custom-call" else None
        return m.group(1) if m else None

    def computes(self) -> bool:
        """An op that keeps the chip busy (fusions are asked about their bodies)."""
        return self.op in _COMPUTE and self.target not in _MOVES


def _module(hlo_text: str) -> tuple[dict[str, list[_Instr]], str | None]:
    """The module's computations (name -> instructions in schedule order) and its entry."""
    comps: dict[str, list[_Instr]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        h = _HEADER.match(line)
        if h:
            current = comps.setdefault(h.group("name"), [])
            entry = h.group("name") if h.group("entry") else entry
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            current.append(_Instr(m.group("name"), m.group("op"), m.group("type"),
                                  _REF.findall(m.group("operands")), m.group("rest")))
    return comps, entry


def _base(op: str) -> str | None:
    base = op.removesuffix("-start").removesuffix("-done")
    return base if base in KINDS else None


def _size(i: _Instr) -> int:
    """The bytes a collective moves, by its result: a combined (tuple) collective's
    results summed; a ``*-start``'s tuple holds its operands too (its largest is its
    result), except an all-reduce's, which are all results."""
    sizes = _bytes(i.type)
    if not sizes:
        return 0
    paired = i.op.endswith("-start") and not i.op.startswith("all-reduce")
    return max(sizes) if paired else sum(sizes)


class _Walker:
    """Walks the scheduled computations in order, pairing starts with dones."""

    def __init__(self, comps: dict[str, list[_Instr]]):
        self.comps = comps
        self.found: list[Collective] = []

    def inner(self, comp: str | None) -> list[tuple[str, int]]:
        """(kind, bytes) of every collective in ``comp`` and the fusions it calls; an
        all-reduce in an ``all-reduce-scatter`` fusion (XLA:TPU's reduce-scatter: the
        all-reduce and the slice of it each chip keeps) is a reduce-scatter, counted by
        its result (the fusion's) as a ``reduce-scatter`` op is."""
        out, body = [], self.comps.get(comp or "", [])
        for i in body:
            if i.op == "all-reduce" and (comp or "").startswith("all-reduce-scatter"):
                out.append(("reduce-scatter", _size(body[-1])))
            elif _base(i.op):
                out.append((_base(i.op), _size(i)))
            elif i.calls:
                out += self.inner(i.calls)
        return out

    def marked(self, comp: str | None) -> bool:
        """Whether ``comp`` holds a collective of an async collective fusion."""
        return any(("async_collective_fusion_config" in i.rest and _base(i.op))
                   or (i.calls and self.marked(i.calls)) for i in self.comps.get(comp or "", ()))

    def target(self, comp: str | None) -> str | None:
        """The custom-call target of ``comp``'s root (the last instruction), if any."""
        body = self.comps.get(comp or "")
        return body[-1].target if body else None

    def computes(self, comp: str | None) -> bool:
        """Whether a fusion of ``comp`` does work beyond moving a collective's buffers
        (a body not in the text is taken to)."""
        if comp not in self.comps:
            return True
        for i in self.comps[comp]:
            if i.op in _PLUMBING or _base(i.op) or i.target in _MOVES:
                continue
            if i.op != "fusion" or self.computes(i.calls):
                return True
        return False

    def walk(self, comp: str) -> None:
        chain: dict[str, str] = {}                 # value -> the start it carries
        flight: dict[str, list] = {}               # start -> [[(kind, bytes)], computed]
        for i in self.comps.get(comp, ()):
            carried = next((chain[o] for o in i.operands if o in chain), None)
            step = self.role(i, carried)
            if step == "start":
                chain[i.name] = i.name
                flight[i.name] = [self.started(i), False]
                continue
            if step == "done":
                self.close(flight.pop(carried, None))
                continue
            if step == "carry":                    # passes a chain's buffers on
                chain[i.name] = carried
            elif step == "sync":
                self.found += [Collective(k, b, False, False) for k, b in self.synchronous(i)]
            if self.computes(i.calls) if i.op == "fusion" else i.computes():
                for entry in flight.values():
                    entry[1] = True
        for entry in flight.values():              # a done in another computation
            self.close(entry)

    def role(self, i: _Instr, carried: str | None) -> str | None:
        """What ``i`` does to the collectives: "start", "done" (of ``carried``), "carry"
        (a get-tuple-element or continuation of ``carried``), "sync" (holds synchronous
        collectives) or None."""
        kind, fusion = _base(i.op), i.op == "fusion"
        target = self.target(i.calls) if fusion else None
        if i.op == "async-start" or (kind and i.op.endswith("-start")) or target == _START:
            return "start"
        if i.op == "async-done" or (kind and i.op.endswith("-done")) or target == _DONE:
            return "done" if carried is not None else None
        if carried is not None and (i.op in ("get-tuple-element", "async-update")
                                    or (fusion and self.marked(i.calls))):
            return "carry"
        if fusion and self.marked(i.calls):
            # a continuation of a chain started in another computation (a collective
            # matmul's loop body carries the entry's chain): counted at its start
            return None
        return "sync" if kind or (fusion and self.inner(i.calls)) else None

    def started(self, i: _Instr) -> list[tuple[str, int]]:
        return [(_base(i.op), _size(i))] if _base(i.op) else self.inner(i.calls)

    def synchronous(self, i: _Instr) -> list[tuple[str, int]]:
        return [(_base(i.op), _size(i))] if _base(i.op) else self.inner(i.calls)

    def close(self, entry: list | None) -> None:
        if entry is not None:
            self.found += [Collective(k, b, entry[1]) for k, b in entry[0]]


def _scheduled(comps: dict[str, list[_Instr]], entry: str) -> list[str]:
    """The entry and every computation it runs as a program (loop bodies, calls), in
    turn; fusion bodies and reductions are not (their call sites stand for them)."""
    order, todo = [], [entry]
    while todo:
        name = todo.pop()
        if name in order or name not in comps:
            continue
        order.append(name)
        for i in comps[name]:
            if i.op in ("while", "call", "conditional"):
                for m in _SUBPROGRAMS.finditer(i.rest):
                    todo += [m.group(1)] if m.group(1) else _REF.findall(m.group(2))
    return order


def analyse(hlo_text: str) -> Report:
    """Every collective in ``hlo_text`` (an optimised, scheduled HLO module), with
    whether compute is scheduled while it is in flight."""
    comps, entry = _module(hlo_text)
    walker = _Walker(comps)
    for comp in _scheduled(comps, entry) if entry else comps:
        walker.walk(comp)
    return Report(walker.found)
