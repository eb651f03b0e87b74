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

A backward and an optimizer step also run the recording (``lazy.stage_boundary``): the
forward's program runs on XLA's threads while Python records the backward, the
backward's while it records the optimizer step, as eager overlaps each op with the next
op's dispatch. Only the optimizer's program is left for a ``loss.item()`` after the step
to wait for (the small GPT's training step with ``loss.item()`` each step, 2 cores: 7.8 ms
with a backward boundary alone, 6.4 with the optimizer's too; eager 8.4).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tpu_kernels import device
from tpu_kernels.lazy import capturing, flush, stage_boundary, start_recording, stats, stop_recording

__all__ = ["deferred", "flush", "stats", "install"]


_installed = False


def install() -> None:
    """Idempotent: a backward and an optimizer step start new stages of a deferred recording."""
    global _installed
    if _installed:
        return
    _installed = True
    device.BACKWARD_STARTS.append(stage_boundary)
    register_optimizer_step_pre_hook(_before_optimizer_step)


def _before_optimizer_step(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    # a compiled ``opt.step`` traces this hook: ``is_compiling`` keeps it out of the graph
    # (and its guards off deferred mode's state)
    if not torch.compiler.is_compiling():
        stage_boundary()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within the block, tpu ops are recorded and run fused (see module docstring)."""
    start_recording()
    try:
        yield
    finally:
        stop_recording()
        if not capturing():    # inside a graph capture the capture's end takes the recording
            flush()
