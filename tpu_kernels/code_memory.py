"""Compiled code is memory-mapped: keep the process's mappings under the kernel's limit.

XLA:CPU maps each executable's machine code into the process, 3 to 6 mappings an
executable. Linux refuses new mappings past ``vm.max_map_count`` (65,530 by default) and
XLA does not survive the refusal: the next compile, executable load or serialization
segfaults or aborts. The runtime's caches of executables are bounded by entry count (the
op cache keeps 8,192), and a long process with many shapes can hold enough executables to
reach the limit (a test suite's worker did, after ~2,000 tests).

So JAX reports every executable it builds or loads to ``_on_event``; every
``CHECK_EVERY``-th, the process's mappings are counted, and past ``HIGH`` of the limit
the runtime's caches and JAX's are emptied (``memory.empty_cache``: what they held is
rebuilt on use, from the persistent compile cache where it is on), with a warning.
The mark is half the limit because a compile maps memory of its own while it runs: a
process kept within 1,500 mappings of the limit still crashed; one kept within 2,500 did not.
``TPU_KERNELS_MAX_MAPS_FRACTION`` sets ``HIGH`` (``0`` turns the guard off).
"""
from __future__ import annotations

import functools
import logging
import os

import jax
from jax._src import dispatch

from tpu_kernels import memory

log = logging.getLogger("tpu_kernels.code_memory")
CHECK_EVERY = 128          # executables built between two counts of the mappings
HIGH = float(os.environ.get("TPU_KERNELS_MAX_MAPS_FRACTION", "0.5"))
_MAPS = "/proc/self/maps"


class _State:
    built = 0       # executables JAX built or loaded since the start
    reliefs = 0     # times the caches were emptied for mappings
    installed = False


STATE = _State()


@functools.cache   # a boot-time setting
def limit() -> int:
    """The kernel's limit on a process's memory mappings (65,530 where it cannot be read)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530


def mappings() -> int:
    """The process's memory mappings now (0 where ``/proc`` has no count)."""
    try:
        with open(_MAPS, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def relieve_if_above(fraction: float) -> bool:
    """Empty the runtime's caches if the mappings exceed ``fraction`` of the limit; whether
    it did."""
    if fraction <= 0:
        return False
    n, cap = mappings(), limit()
    if n <= fraction * cap:
        return False
    memory.empty_cache()
    STATE.reliefs += 1
    log.warning("%d memory mappings of the %d the kernel allows (compiled code): emptied the "
                "executable caches (now %d); a program that keeps compiling new shapes pays "
                "their recompiles", n, cap, mappings())
    return True


def _on_event(event: str, duration: float, **kwargs: object) -> None:
    if event != dispatch.BACKEND_COMPILE_EVENT:
        return
    STATE.built += 1
    if STATE.built % CHECK_EVERY == 0:
        relieve_if_above(HIGH)


def install() -> None:
    """Watch the executables JAX builds (once per process; only where ``/proc`` counts)."""
    if STATE.installed or HIGH <= 0 or not os.path.exists(_MAPS):
        return
    STATE.installed = True
    jax.monitoring.register_event_duration_secs_listener(_on_event)
