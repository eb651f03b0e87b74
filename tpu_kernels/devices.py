"""The tpu devices: JAX's local devices as ``tpu:0`` .. ``tpu:N-1``, and the current one.

A TPU host's chips, or, without a TPU, JAX's CPU devices (one by default;
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before JAX starts gives N). A
device index out of range raises as CUDA does ("invalid device ordinal").
"""
from __future__ import annotations

import functools
import threading
from typing import Any

import jax
import torch

_state = threading.local()   # the current device is per thread, as CUDA's is
# more than one tpu device (set with the device list, which any index but 0 was checked
# against): the dispatcher checks that a call's tensors share a device only then
several = False


@functools.cache
def jax_devices() -> tuple:
    """This process's JAX devices, in index order (``tpu:i`` is ``jax_devices()[i]``)."""
    global several
    found = tuple(jax.local_devices())
    several = len(found) > 1
    return found


@functools.cache
def _index_of() -> dict:
    return {d: i for i, d in enumerate(jax_devices())}


def index_of_device(device: jax.Device) -> int:
    """The tpu index of a JAX device of this process (0 for one that is not)."""
    return _index_of().get(device, 0)


def device_count() -> int:
    return len(jax_devices())


def check_index(index: int) -> int:
    """``index`` if it names a device, else torch's error for a bad ordinal."""
    n = device_count()
    if not 0 <= index < n:
        raise RuntimeError(f"tpu error: invalid device ordinal: device index {index} is out of range "
                           f"(this process has {n} tpu device(s): tpu:0..tpu:{n - 1})")
    return index


def index(device: Any = None, optional: bool = True) -> int:
    """The index ``device`` names (``None``, ``"tpu"`` or ``torch.device("tpu")``: the
    current device), checked; an ``int`` is an index."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        return check_index(device)
    d = torch.device(device)
    if d.type != "tpu":
        raise ValueError(f"Expected a tpu device, but got: {d}")
    return current_device() if d.index is None else check_index(d.index)


def current_device() -> int:
    return getattr(_state, "index", 0)


def set_device(device: Any) -> None:
    """Make ``device`` current: ``torch.ones(3, device="tpu")`` goes there."""
    i = index(device)
    _state.index = i


def jax_device(device: Any = None) -> jax.Device:
    """The JAX device behind a tpu device (default: the current one)."""
    return jax_devices()[index(device)]


def index_of_array(array: Any) -> int:
    """The tpu index of the device holding a committed single-device ``array`` (0 when
    there is one device or the array is not placed yet)."""
    if device_count() == 1:
        return 0
    if isinstance(array, jax.core.Tracer):   # traced inside a jitted program: no placement yet
        return current_device()
    devices = getattr(array, "devices", None)
    if devices is None:
        return 0
    ds = devices()
    return index_of_device(next(iter(ds))) if len(ds) == 1 else 0


# torch.compile calls these at trace time and keeps the answer (as for torch.cuda's):
# Dynamo's mark for torch.compiler.assume_constant_result, set without importing Dynamo
for _fn in (device_count, current_device):
    _fn._dynamo_marked_constant = True


class device:
    """``with torch.tpu.device(i):`` makes tpu ``i`` current inside the block (as
    ``torch.cuda.device``); ``-1`` or ``None`` leaves it as it is."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None or device == -1 else index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = current_device()
        if self.idx != -1:
            set_device(self.idx)

    def __exit__(self, *exc: Any) -> None:
        if self.idx != -1:
            set_device(self.prev_idx)


class device_of(device):
    """``with torch.tpu.device_of(t):`` makes ``t``'s device current (a no-op for a CPU tensor)."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "tpu" else -1)


def synchronize(device: Any = None) -> None:
    """Wait until every computation queued on ``device`` (default: all of them) is done."""
    want = None if device is None else jax_device(device)
    for a in jax.live_arrays():
        if want is None or want in a.devices():
            a.block_until_ready()


def name(device: Any = None) -> str:
    """``get_device_name``: the chip's kind ("TPU v5 lite") or "cpu (no TPU)"."""
    d = jax_device(device)
    return "cpu (no TPU)" if d.platform == "cpu" else d.device_kind
