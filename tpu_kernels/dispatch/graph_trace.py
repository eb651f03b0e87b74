"""What the dispatcher asks while a compiled graph is being traced into one program.

Eager ops draw a fresh key from the device generator, report device-side check flags to
``errors.watch`` and return contiguous results. Inside a compiled graph (one
``jax.jit``) they must instead take keys from the graph's traced key input, return their
flags as the graph's outputs, and give results torch's strides (the graph's later views
were recorded against them). The compile layer owns one ``GraphTrace`` per trace and
enters it with ``tracing``; nothing else writes this state.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Iterator

import jax
import jax.numpy as jnp

# Builders that may run a graph's program another way (tpu_kernels.distributed: a graph
# with collectives becomes one program over every rank's device): hook(gm, trace) returns
# the jitted callable, or None to leave the graph to the plain jax.jit. Kept here, not in
# graph_program (which loads torch's symbolic shapes), so registering one costs nothing.
PROGRAM_HOOKS: list = []


def register_program_hook(hook) -> None:
    """Add ``hook(gm, trace) -> callable | None`` (see ``PROGRAM_HOOKS``)."""
    if hook not in PROGRAM_HOOKS:
        PROGRAM_HOOKS.append(hook)


@dataclasses.dataclass
class GraphTrace:
    """The state of one graph trace: the key source, the check sink, the stride policy."""
    key_data: jax.Array            # traced (seed low, seed high, counter) of the graph's first random op
    random_ops: int = 0            # random ops traced so far (each takes the next counter)
    checks: list = dataclasses.field(default_factory=list)   # (flags, op, checks) per checked op
    torch_strides: bool = True     # results take the strides torch's meta functions give
    replay_key: jax.Array | None = None   # the key every random op takes while set

    def next_key_data(self) -> jax.Array:
        if self.replay_key is not None:
            return self.replay_key
        kd = self.peek_key_data()
        self.random_ops += 1
        return kd

    def peek_key_data(self) -> jax.Array:
        """The key the next random op will take (without taking it)."""
        return self.key_data + jnp.array([0, 0, self.random_ops], jnp.uint32)

    @contextlib.contextmanager
    def replaying_key(self, key_data: jax.Array) -> Iterator[None]:
        """Random ops take ``key_data`` (an op recomputed from a saved generator state:
        ``runtime_ops/checkpoint_rng.py``)."""
        old, self.replay_key = self.replay_key, key_data
        try:
            yield
        finally:
            self.replay_key = old

    def add_checks(self, flags: Any, op: str, checks: list) -> None:
        self.checks.append((flags, op, checks))


class _Local(threading.local):
    trace: GraphTrace | None = None   # a class default: no AttributeError on eager's hot path


_local = _Local()


def active() -> GraphTrace | None:
    """The graph trace this thread is in, or None (eager)."""
    return _local.trace


@contextlib.contextmanager
def tracing(trace: GraphTrace) -> Iterator[GraphTrace]:
    old = _local.trace
    _local.trace = trace
    try:
        yield trace
    finally:
        _local.trace = old
