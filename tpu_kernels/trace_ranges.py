"""``torch.tpu.nvtx``: ``torch.cuda.nvtx``'s ranges and marks as JAX profiler annotations.

Code profiled on CUDA marks its phases with ``torch.cuda.nvtx.range_push("forward")`` /
``range_pop()`` or ``with torch.cuda.nvtx.range("step {}", i):``. Here each range is a
``jax.profiler.TraceAnnotation``: it shows in a trace taken with ``jax.profiler.trace``
(TensorBoard, Perfetto) around the host work, and costs next to nothing untraced.
Pushed ranges nest per thread, as NVTX's do; ``range_start``/``range_end`` need not nest.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any, Iterator

import jax

_local = threading.local()
_started: dict[int, jax.profiler.TraceAnnotation] = {}
_ids = itertools.count(1)


def _stack() -> list:
    s = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def _entered(msg: str) -> jax.profiler.TraceAnnotation:
    ann = jax.profiler.TraceAnnotation(str(msg))
    ann.__enter__()
    return ann


def range_push(msg: str) -> int:
    """Start a nested range; its zero-based depth."""
    stack = _stack()
    stack.append(_entered(msg))
    return len(stack) - 1


def range_pop() -> int:
    """End the innermost range of this thread; the depth it had (-1 if none was open)."""
    stack = _stack()
    if not stack:
        return -1
    stack.pop().__exit__(None, None, None)
    return len(stack)


def range_start(msg: str) -> int:
    """Start a range that need not nest; its id for ``range_end``."""
    rid = next(_ids)
    _started[rid] = _entered(msg)
    return rid


def range_end(range_id: int) -> None:
    """End the range ``range_start`` gave ``range_id``."""
    ann = _started.pop(range_id, None)
    if ann is None:
        raise ValueError(f"torch.tpu.nvtx.range_end: no open range with id {range_id}")
    ann.__exit__(None, None, None)


def mark(msg: str) -> None:
    """An instant event."""
    with jax.profiler.TraceAnnotation(str(msg)):
        pass


@contextlib.contextmanager
def range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:   # noqa: A001  (torch's name)
    """``range_push(msg.format(*args, **kwargs))`` for the block, then ``range_pop()``."""
    range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        range_pop()
