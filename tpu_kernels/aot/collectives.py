"""The collectives in a compiled SPMD program, read from its optimised HLO text.

Each collective (all-gather, all-reduce, reduce-scatter, all-to-all, collective-permute) is
counted with the bytes of its result. XLA schedules a collective asynchronously as a
``*-start`` / ``*-done`` pair (or an ``async-start``/``async-done`` around it); the
instructions listed between the two in the scheduled module run while it is in flight. A
pair with compute (a fusion, a dot, a convolution, a custom call) between its start and
done *overlaps*; a synchronous collective, or a pair with nothing between, does not.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
         "ragged-all-to-all")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.-]+)\s*=\s*(?P<type>.+?)\s+"
                    r"(?P<op>[a-z][\w-]*)\((?P<operands>[^)]*)\)(?P<rest>.*)$")
_ARRAY = re.compile(r"\b(?P<dtype>pred|s\d+|u\d+|f\d+|bf16|f8\w*|c\d+)\[(?P<dims>[\d,]*)\]")
_COMPUTE = ("fusion", "convolution", "dot", "custom-call")
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


def _kind(op: str, rest: str) -> str | None:
    base = op.removesuffix("-start").removesuffix("-done")
    if base in KINDS:
        return base
    if op in ("async-start", "async-done"):       # a wrapped collective: calls=%...
        m = re.search(r"calls=%([\w-]+)", rest)
        name = m.group(1) if m else ""
        return next((k for k in KINDS if name.startswith(k)), None)
    return None


def analyse(hlo_text: str) -> Report:
    """Every collective in ``hlo_text`` (an optimised, scheduled HLO module), with
    whether compute is scheduled while it is in flight."""
    found: list[Collective] = []
    in_flight: dict[str, list] = {}          # start instruction name -> [kind, bytes, computed]
    for line in hlo_text.splitlines():
        if line.rstrip().endswith("{") or line.strip() == "}":     # a computation's bounds
            in_flight.clear()
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        op, rest = m.group("op"), m.group("rest")
        kind = _kind(op, rest)
        if op.endswith("-start") and kind:
            sizes = _bytes(m.group("type"))
            in_flight[m.group("name")] = [kind, max(sizes) if sizes else 0, False]
        elif op.endswith("-done") and kind:
            start = m.group("operands").strip().lstrip("%").split(",")[0].strip().lstrip("%")
            entry = in_flight.pop(start, None)
            if entry is not None:
                found.append(Collective(entry[0], entry[1], entry[2]))
        elif kind:                                  # a synchronous collective
            sizes = _bytes(m.group("type"))
            found.append(Collective(kind, max(sizes) if sizes else 0, False, False))
        elif op in _COMPUTE or op.startswith(_COMPUTE):
            for entry in in_flight.values():
                entry[2] = True
    return Report(found)
