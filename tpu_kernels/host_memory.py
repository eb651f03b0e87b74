"""Pinned host memory for the tpu device: ``t.pin_memory()``, ``DataLoader(pin_memory=True)``.

JAX copies host buffers to the device itself (through its own staging buffers), so there
is no page-locked allocator to expose; a pinned tensor here is a documented host buffer:
a private contiguous CPU copy that ``is_pinned()`` reports as pinned while the tensor
returned by ``pin_memory()`` lives. ``x.to("tpu", non_blocking=True)`` from it (or from
any CPU tensor) is a copy JAX runs asynchronously; the values are those of the moment of
the call, as CUDA guarantees for pinned sources.
"""
from __future__ import annotations

import functools

import threading
import weakref

import torch

_LIB = torch.library.Library("aten", "IMPL")
_lock = threading.Lock()
_pinned: dict[int, int] = {}   # host storage data_ptr -> live pinned tensors over it


def _release(ptr: int) -> None:
    with _lock:
        n = _pinned.get(ptr, 0) - 1
        if n > 0:
            _pinned[ptr] = n
        else:
            _pinned.pop(ptr, None)


def _pin_memory(self: torch.Tensor, device=None) -> torch.Tensor:
    out = self.clone(memory_format=torch.contiguous_format)
    ptr = out.untyped_storage().data_ptr()
    with _lock:
        _pinned[ptr] = _pinned.get(ptr, 0) + 1
    weakref.finalize(out, _release, ptr)
    return out


def _is_pinned(self: torch.Tensor, device=None) -> bool:
    return self.untyped_storage().data_ptr() in _pinned if self.numel() else False


@functools.cache   # once per process
def install() -> None:
    """CPU kernels of ``_pin_memory`` and ``is_pinned`` (torch asks the accelerator's
    pinned allocator, which a Python backend cannot provide)."""
    _LIB.impl("_pin_memory", _pin_memory, "CPU")
    _LIB.impl("is_pinned", _is_pinned, "CPU")
