"""Streams and events of the tpu device, for device-agnostic code (FSDP2, DDP, DTensor).

JAX orders a device's computations by their data dependences, and a tpu op's result is
a JAX array that later ops wait for: there is one logical stream, and ordering between
"streams" always holds. So these objects only keep torch's stream API working: waits and
records are free, and ``synchronize`` waits for the device.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import jax

from tpu_kernels import errors


def synchronize(device: Any = None) -> None:
    """Wait for every queued computation on the device (and raise deferred device errors)."""
    for a in jax.live_arrays():
        a.block_until_ready()
    errors.raise_pending()


class Stream:
    """A tpu stream (all of them are the device's one ordered queue)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = device
        self.priority = priority

    def wait_stream(self, stream: "Stream") -> None:
        pass

    def wait_event(self, event: "Event") -> None:
        pass

    def record_event(self, event: "Event | None" = None) -> "Event":
        return event or Event()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        synchronize()


class Event:
    """A tpu event: recorded and waited on for free (see the module docstring)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        pass

    def record(self, stream: Stream | None = None) -> None:
        pass

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        synchronize()


_DEFAULT = Stream()
_current = _DEFAULT


def current_stream(device: Any = None) -> Stream:
    return _current


def default_stream(device: Any = None) -> Stream:
    return _DEFAULT


def set_stream(stream: Stream) -> None:
    global _current
    _current = stream


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    """``with torch.tpu.stream(s):`` makes ``s`` current for the block."""
    global _current
    old = _current
    _current = s if s is not None else old
    try:
        yield
    finally:
        _current = old
