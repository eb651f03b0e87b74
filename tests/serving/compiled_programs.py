"""Which compiled tpu graphs ran inside a block, and how often each was called and traced.

Graphs are shared between model instances of the same shapes (Dynamo guards on
shapes, parameters are graph inputs), so tests count activity, not new programs."""
from __future__ import annotations

import dataclasses

from tpu_kernels import compile_backend


@dataclasses.dataclass
class Ran:
    program: compile_backend.GraphProgram
    calls: int          # calls inside the block
    traces: int         # jax traces inside the block


class Activity:
    def __enter__(self) -> "Activity":
        self._before = {id(p): (p.traces, p.calls) for p in compile_backend.PROGRAMS}
        self.ran: list[Ran] = []
        return self

    def __exit__(self, *exc) -> None:
        for p in compile_backend.PROGRAMS:
            traces, calls = self._before.get(id(p), (0, 0))
            if p.calls > calls:
                self.ran.append(Ran(p, p.calls - calls, p.traces - traces))

    def summary(self) -> list[tuple[int, int, int]]:
        """(calls, traces here, traces ever) per graph that ran, fewest calls first."""
        return sorted((r.calls, r.traces, r.program.traces) for r in self.ran)
