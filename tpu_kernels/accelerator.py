"""``torch.accelerator.*`` for the tpu device.

torch answers these through the backend's C++ device guard, which a Python backend
provides only in part (no streams, no synchronize, no allocator). Where torch's answer
for the tpu accelerator fails, ``torch.accelerator``'s function asks ``torch.tpu``; for
any other accelerator torch's own function runs unchanged.
"""
from __future__ import annotations

import functools
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


@functools.cache   # once per process
def install() -> None:
    for name, ours in _FUNCTIONS.items():
        theirs = getattr(torch.accelerator, name, None)
        if theirs is not None and not getattr(theirs, "__tpu_kernels__", False):
            setattr(torch.accelerator, name, _routed(name, theirs, ours))
    torch.accelerator.device_index = devices.device if _on_tpu() else torch.accelerator.device_index
