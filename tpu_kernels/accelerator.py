"""``torch.accelerator.*`` for the tpu device.

torch answers these through the backend's C++ device guard, which a Python backend
provides only in part (no streams, no synchronize, no allocator). Where torch's answer
for the tpu accelerator fails, ``torch.accelerator``'s function asks ``torch.tpu``; for
any other accelerator torch's own function runs unchanged.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import torch

from tpu_kernels import devices, memory, streams


def _synchronize(device: Any = None) -> None:
    torch.tpu.synchronize(device)


# torch.accelerator name -> what torch.tpu does
_FUNCTIONS: dict[str, Callable] = {
    "synchronize": _synchronize,
    "current_stream": streams.current_stream,
    "set_stream": streams.set_stream,
    "empty_cache": lambda: memory.empty_cache(),
    "memory_allocated": memory.memory_allocated,
    "max_memory_allocated": memory.max_memory_allocated,
    "memory_reserved": memory.memory_reserved,
    "max_memory_reserved": memory.max_memory_reserved,
    "memory_stats": memory.memory_stats,
    "reset_peak_memory_stats": memory.reset_peak_memory_stats,
    "reset_accumulated_memory_stats": memory.reset_accumulated_memory_stats,
    "get_memory_info": memory.mem_get_info,
    "current_device_index": devices.current_device,
    "current_device_idx": devices.current_device,
    "set_device_index": devices.set_device,
    "set_device_idx": devices.set_device,
    "device_count": devices.device_count,
}


def _on_tpu() -> bool:
    acc = torch._C._accelerator_getAccelerator()
    return acc is not None and acc.type == "tpu"


def _routed(name: str, theirs: Callable, ours: Callable) -> Callable:
    # never traced: every torch.compile'd call asks for the current stream before its graph
    # runs (Dynamo's stream tracking), and a traced router would run guards of its own there
    # (torch._disable_dynamo: torch's lazy torch._dynamo.disable, so Dynamo is not loaded here)
    @torch._disable_dynamo
    @functools.wraps(theirs)
    def accelerator_fn(*args: Any, **kwargs: Any) -> Any:
        return ours(*args, **kwargs) if _on_tpu() else theirs(*args, **kwargs)
    accelerator_fn.__tpu_kernels__ = True
    return accelerator_fn


def _current_stream_first(routed: Callable) -> Callable:
    """``torch.accelerator.current_stream`` with a path that makes no Python call.

    Dynamo's bytecode asks for the current stream before every compiled graph runs. Through
    ``_routed``'s wrapper that is 2-3 µs a compiled call (Dynamo's disable context around
    four Python calls); here a tpu device's current stream is two dict reads, and the
    function's own frame is one Dynamo skips (marked on the first call that finds Dynamo
    loaded: it never traces it). Anything else goes through ``routed``."""
    marked = False

    def current_stream(device: Any = None) -> Any:
        nonlocal marked
        if not marked:
            marked = _skip_in_dynamo(current_stream)
        acc = torch._C._accelerator_getAccelerator()
        if acc is not None and acc.type == "tpu" and type(device) is torch.device \
                and device.type == "tpu" and device.index is not None:
            s = streams.CURRENT.get(device.index) or streams.DEFAULTS.get(device.index)
            if s is not None:
                return s
        return routed(device)
    current_stream.__tpu_kernels__ = True
    current_stream.__wrapped__ = routed
    return current_stream


def _skip_in_dynamo(fn: Callable) -> bool:
    """Tell Dynamo, if loaded, to run ``fn`` as is wherever it meets it; whether it was."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return False
    eval_frame.skip_code(fn.__code__)
    return True


@functools.cache   # once per process
def install() -> None:
    for name, ours in _FUNCTIONS.items():
        theirs = getattr(torch.accelerator, name, None)
        if theirs is not None and not getattr(theirs, "__tpu_kernels__", False):
            routed = _routed(name, theirs, ours)
            setattr(torch.accelerator, name, _current_stream_first(routed) if name == "current_stream" else routed)
    torch.accelerator.device_index = devices.device if _on_tpu() else torch.accelerator.device_index
