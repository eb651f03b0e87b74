"""A bound on multi-device programs in flight on JAX's CPU backend.

XLA's CPU client runs every device's part of a program on one shared thread pool and
queues programs asynchronously. With many multi-device programs queued (an eager
training step dispatches thousands), devices' threads end up waiting in a collective's
rendezvous for devices whose threads are taken by later programs: XLA aborts the
process after 40 s ("Expected 8 threads to join the rendezvous, but only 6 of them
arrived"). Reproduced with 2 to 8 forced host devices on a 2-core machine by queueing a
few thousand small ``psum`` programs; waiting for a program after every few keeps it
from happening. So once a mesh spans several CPU devices (``spmd.Mesh``), each program
run through the runtime is tracked and at most ``WINDOW`` are left in flight. On a TPU
or GPU nothing is tracked (their runtimes order programs per device).
"""
from __future__ import annotations

import collections
from typing import Any

import jax

WINDOW = 8
_queue: collections.deque = collections.deque()
_on = False


def watch(devices: list[jax.Device]) -> None:
    """Start bounding programs in flight if ``devices`` are several CPU devices."""
    global _on
    if len(devices) > 1 and all(d.platform == "cpu" for d in devices):
        _on = True


def track(out: Any) -> Any:
    """Note that ``out`` (a program's outputs) is in flight; wait for the oldest tracked
    outputs beyond ``WINDOW``. Returns ``out``."""
    if _on:
        _queue.append(out)
        while len(_queue) > WINDOW:
            jax.block_until_ready(_queue.popleft())
    return out
