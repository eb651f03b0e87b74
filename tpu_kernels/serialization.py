"""``torch.save`` / ``torch.load`` of tpu tensors, as for CUDA tensors.

A tpu tensor pickles as its storage (a host copy and its location, "tpu:0") and its
geometry (``TpuTensor.__reduce_ex__``), so views of one storage share it again after the
load. The rebuild functions are torch safe globals: the default ``weights_only=True``
loads them. ``map_location`` is honoured as torch does: "cpu" gives CPU tensors;
"tpu", "tpu:1", a ``torch.device``, a dict or a callable say where each saved location
goes. A checkpoint of CPU tensors loaded with a tpu ``map_location`` cannot build tpu
tensors from torch's storages (a tpu tensor has no torch storage), so ``torch.load`` is
wrapped: those storages are loaded to the host and moved, one tpu storage each (sharing
kept), to the device they map to.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from tpu_kernels import devices
from tpu_kernels.storage import LOAD, Storage, rebuild_storage, to_jax
from tpu_kernels.tensor import TpuTensor, rebuild_tensor


def _tpu_target(map_location: Any, location: str) -> torch.device | None:
    """The tpu device a storage saved at ``location`` maps to, or None."""
    if isinstance(map_location, dict):
        target = map_location.get(location)
    elif isinstance(map_location, (str, torch.device)):
        target = map_location
    else:
        return None
    if target is None:
        return None
    d = torch.device(target)
    return torch.device("tpu", devices.index(d)) if d.type == "tpu" else None


def _targets_tpu(map_location: Any) -> bool:
    if isinstance(map_location, dict):
        return any(torch.device(v).type == "tpu" for v in map_location.values())
    return isinstance(map_location, (str, torch.device)) and torch.device(map_location).type == "tpu"


def _move(obj: Any, to: dict[int, torch.device], moved: dict[int, Storage]) -> Any:
    """``obj`` with each CPU tensor whose storage is in ``to`` on that tpu device (one tpu
    storage per host storage, so views and tied tensors stay shared)."""
    if isinstance(obj, torch.Tensor) and not isinstance(obj, TpuTensor) and obj.device.type == "cpu":
        key = obj.untyped_storage().data_ptr()
        if key not in to:
            return obj
        st = moved.get(key)
        if st is None:
            flat = torch.empty(0, dtype=obj.dtype).set_(obj.untyped_storage())
            i = to[key].index
            st = moved[key] = Storage(to_jax(flat, i), i)
        t = rebuild_tensor(st, tuple(obj.shape), obj.stride(), obj.storage_offset(), obj.dtype, False)
        if isinstance(obj, torch.nn.Parameter):
            return torch.nn.Parameter(t, requires_grad=obj.requires_grad)
        return t.requires_grad_(obj.requires_grad) if obj.requires_grad else t
    if isinstance(obj, torch.nn.Module):
        return obj._apply(lambda t: _move(t, to, moved))
    if isinstance(obj, dict):
        out = type(obj)() if type(obj) is not dict else {}
        for k, v in obj.items():
            out[k] = _move(v, to, moved)
        if hasattr(obj, "_metadata"):   # a state dict's version records
            out._metadata = obj._metadata
        return out
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_move(v, to, moved) for v in obj)
    return obj


def _wrap_load(load: Callable) -> Callable:
    @functools.wraps(load)
    def tpu_aware_load(f, map_location=None, *args: Any, **kwargs: Any):
        if not _targets_tpu(map_location):
            return load(f, map_location, *args, **kwargs)
        to: dict[int, torch.device] = {}

        def restore(storage, location):
            target = _tpu_target(map_location, location)
            if target is None or location.startswith("tpu"):
                # saved tpu storages are handled by rebuild_storage; others as torch does
                return torch.serialization.default_restore_location(
                    storage, str(map_location.get(location, location)) if isinstance(map_location, dict)
                    else location)
            to[storage.data_ptr()] = target
            return storage

        LOAD.map_location = map_location
        try:
            obj = load(f, restore, *args, **kwargs)
        finally:
            LOAD.map_location = None
        return _move(obj, to, {}) if to else obj
    tpu_aware_load.__wrapped_by_tpu_kernels__ = True
    return tpu_aware_load


def _host_restore(storage, location):
    """A saved tpu storage's host copy is tagged "cpu"; a storage tagged "tpu..." (written by
    torch itself for a tpu tensor with a real storage) is kept on the host for the rebuild."""
    if location.startswith("tpu"):
        return storage


@functools.cache   # once per process
def install() -> None:
    torch.serialization.add_safe_globals([rebuild_tensor, rebuild_storage])
    torch.serialization.register_package(19, lambda obj: None, _host_restore)   # before torch's privateuse1 entry (23)
    if not getattr(torch.load, "__wrapped_by_tpu_kernels__", False):
        torch.load = torch.serialization.load = _wrap_load(torch.serialization.load)
