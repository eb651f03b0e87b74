"""Deferred eager mode: record ops, run each recorded stretch as one jitted XLA program.

    with tpu_kernels.deferred():          # or TPU_KERNELS_DEFERRED=1 for the whole process
        loss = model(x).sum(); loss.backward(); opt.step()
    print(loss.item())                    # a value is needed: the recording runs now

Inside the mode an op on tpu tensors does not run: the dispatcher records its jitted
function (``lazy.record``) and hands back placeholders with the result's shape and
dtype. A recording runs when a value is needed (``.item()``, ``.cpu()``, printing, an op
whose result shape depends on data, the CPU fallback), when it reaches
``lazy.MAX_NODES`` ops, at ``flush()``, and when the block exits. Semantics stay
eager's: the same impls run in the same order.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from tpu_kernels.lazy import flush, start_recording, stats, stop_recording

__all__ = ["deferred", "flush", "stats"]


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within the block, tpu ops are recorded and run fused (see module docstring)."""
    start_recording()
    try:
        yield
    finally:
        stop_recording()
        flush()
