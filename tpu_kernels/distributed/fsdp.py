"""What FSDP2 (``fully_shard``) needs from the tpu device beyond collectives.

- Its own ops (``fsdp::all_gather_copy_in``, ``split_with_sizes_copy``, ``chunk_cat``,
  ``copy_``) reach the tpu tensor's ``__torch_dispatch__``; they are torch code over views
  and copies, so their CPU kernel runs, calling torch ops that come back per tensor.
- It frees an unsharded parameter's memory after use by resizing the all-gather output's
  storage to 0 bytes and re-grows it before the next all-gather. A tpu tensor's torch
  storage is a placeholder that cannot be resized (its data is a JAX array), so
  ``free_storage`` / ``alloc_storage`` of FSDP2 are wrapped: for tpu tensors they drop
  the JAX array (the memory goes back to the device) and put back zeros of the same
  size, which the next all-gather overwrites.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import jax.numpy as jnp
import torch

from tpu_kernels.tensor import TpuTensor

OPS = ("all_gather_copy_in", "split_with_sizes_copy", "chunk_cat", "copy_")
_freed: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()   # storage -> (shape, dtype)


def run_cpu_kernel(op, args, kwargs) -> Any:
    """An ``fsdp::`` op: its CPU kernel (torch ops on these tensors, dispatched per op)."""
    return op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **kwargs)


def chunk_cat(op, args, kwargs) -> None:
    """``fsdp::chunk_cat``: its kernel's ``torch._chunk_cat(..., out=)`` needs ``cat.out``;
    the functional ``_chunk_cat`` and a copy need only ops the registry has."""
    tensors, dim, num_chunks = args[:3]
    out = kwargs["out"] if "out" in kwargs else args[3]
    out.copy_(torch._chunk_cat(tensors, dim, num_chunks))


def free(tensor: torch.Tensor) -> bool:
    """Release a tpu tensor's device memory (FSDP2's ``free_storage``); False if not tpu."""
    if not isinstance(tensor, TpuTensor):
        return False
    st = tensor._tpu_storage
    if st not in _freed and st.array.size:
        _freed[st] = (st.array.shape, st.array.dtype)
        st.array = jnp.zeros((0,), st.array.dtype)
        st.version += 1
    return True


def alloc(tensor: torch.Tensor) -> bool:
    """Give a freed tpu tensor its memory back, zeroed (FSDP2's ``alloc_storage``)."""
    if not isinstance(tensor, TpuTensor):
        return False
    st = tensor._tpu_storage
    if st in _freed:
        shape, dtype = _freed.pop(st)
        st.array = jnp.zeros(shape, dtype)
        st.version += 1
    return True


def _wrap(original: Callable, ours: Callable[[torch.Tensor], bool]) -> Callable:
    def storage_op(tensor: torch.Tensor) -> None:
        if not ours(tensor):
            original(tensor)
    storage_op.__wrapped__ = original
    return storage_op


def install() -> dict:
    """Wrap FSDP2's storage helpers; returns the ``fsdp::`` op handlers."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    if not hasattr(_fsdp_param.free_storage, "__wrapped__"):
        _fsdp_param.free_storage = _wrap(_fsdp_param.free_storage, free)
        _fsdp_param.alloc_storage = _wrap(_fsdp_param.alloc_storage, alloc)
        _fsdp_param_group.alloc_storage = _fsdp_param.alloc_storage
    out = {getattr(torch.ops.fsdp, name).default: run_cpu_kernel for name in OPS}
    out[torch.ops.fsdp.chunk_cat.default] = chunk_cat
    return out
