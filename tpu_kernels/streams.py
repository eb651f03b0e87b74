"""Streams and events of the tpu device, with torch.cuda's API (device-agnostic code:
FSDP2, DDP, DTensor, timing loops).

JAX orders a device's computations by their data dependences, and a tpu op's result is
a JAX array that later ops wait for: there is one logical stream per device, and ordering
between "streams" always holds. So waits are free; ``synchronize`` waits for the device;
an event records the time at which the device had finished everything queued before it,
so ``start.elapsed_time(end)`` measures real device time (a synchronising clock).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import torch

from tpu_kernels import devices


class Stream:
    """A tpu stream (every stream of a device is its one ordered queue)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device_index = devices.index(device)
        self.priority = priority
        self.stream_id = kwargs.get("stream_id", 0)

    @property
    def device(self) -> torch.device:
        return torch.device("tpu", self.device_index)

    device_type = property(lambda self: 21)   # c10::DeviceType::PrivateUse1, as torch.Stream reports

    def wait_stream(self, stream: "Stream") -> None:
        pass

    def wait_event(self, event: "Event") -> None:
        pass

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        devices.synchronize(self.device_index)

    def __enter__(self) -> "Stream":
        self._prev = current_stream(self.device_index)
        set_stream(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        set_stream(self._prev)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and (other.device_index, other.stream_id) == (self.device_index, self.stream_id)

    def __hash__(self) -> int:
        return hash((self.device_index, self.stream_id))

    def __repr__(self) -> str:
        return f"<torch.tpu.Stream device=tpu:{self.device_index} stream_id={self.stream_id}>"


def record_stream(t: torch.Tensor, stream: Any) -> None:
    """``Tensor.record_stream(stream)`` for a tpu tensor: nothing to record. On CUDA it tells
    the caching allocator that ``stream`` still uses the memory; here a queued computation
    keeps the arrays it reads alive until it is done. The argument is checked as torch does."""
    if not isinstance(stream, Stream):
        raise TypeError(f"record_stream(): argument 's' (position 1) must be a tpu Stream "
                        f"(torch.tpu.Stream), not {type(stream).__name__}")


class Event:
    """A tpu event: ``record`` waits for the device and notes the time (see the module
    docstring); ``wait`` is free."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None
        self._device_index: int | None = None

    def record(self, stream: Stream | None = None) -> None:
        stream = stream or current_stream()
        self._device_index = stream.device_index
        devices.synchronize(stream.device_index)
        self._time = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        if self._device_index is not None:
            devices.synchronize(self._device_index)

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds from this event to ``end_event`` (both recorded, with timing on)."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0

    def __repr__(self) -> str:
        return f"<torch.tpu.Event recorded={self._time is not None}>"


DEFAULTS: dict[int, Stream] = {}   # device index -> its default stream, once made
CURRENT: dict[int, Stream] = {}    # device index -> the stream made current there, if any


def default_stream(device: Any = None) -> Stream:
    i = devices.index(device)
    s = DEFAULTS.get(i)
    if s is None:
        s = DEFAULTS[i] = Stream(i)
    return s


def current_stream(device: Any = None) -> Stream:
    i = devices.index(device)
    return CURRENT.get(i) or default_stream(i)


def set_stream(stream: Stream) -> None:
    if stream is not None:
        CURRENT[stream.device_index] = stream


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    """``with torch.tpu.stream(s):`` makes ``s`` current for the block."""
    if s is None:
        yield
        return
    old = current_stream(s.device_index)
    set_stream(s)
    try:
        yield
    finally:
        set_stream(old)
