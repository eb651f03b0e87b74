"""In-place ops that change a tensor's metadata, not its values: ``as_strided_``,
``squeeze_``, ``unsqueeze_``, ``transpose_``, ``t_``, ``swapdims_``, ``resize_``, ``resize_as_``,
``detach_``, ``set_`` (and the query ``is_set_to``).

A lowering returns values; these ops instead re-point ``self`` at a new geometry of its
storage (or, for a growing ``resize_``, at a new storage holding the old values first).
``tensor.repoint`` swaps the wrapper's sizes and strides in place, so every reference to
``self`` sees the change, as in torch.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax.numpy as jnp
import torch

from tpu_kernels import strided
from tpu_kernels.lazy import concrete
from tpu_kernels.dispatch import run
from tpu_kernels.dispatch.meta import meta_call
from tpu_kernels.registry import register_runtime, runtime_handler
from tpu_kernels.storage import Storage, to_jax
from tpu_kernels.tensor import TpuTensor, repoint

aten = torch.ops.aten

# in-place op -> its functional op, a view: the in-place op takes the view
_VIEW_TWINS = {
    aten.as_strided_.default: aten.as_strided.default,
    aten.squeeze_.default: aten.squeeze.default, aten.squeeze_.dim: aten.squeeze.dim,
    aten.squeeze_.dims: aten.squeeze.dims, aten.unsqueeze_.default: aten.unsqueeze.default,
    aten.transpose_.default: aten.transpose.int, aten.t_.default: aten.t.default,
    aten.swapdims_.default: aten.transpose.int, aten.swapaxes_.default: aten.transpose.int,
}


def _view_inplace(functional: Any) -> Callable:
    """``foo_`` whose functional ``foo`` is a view: take the view, re-point ``self`` at it."""
    def view_inplace(op, args, kwargs):
        return repoint(args[0], run(functional, args, kwargs))
    return view_inplace


for _inplace, _functional in _VIEW_TWINS.items():
    register_runtime(_inplace, _view_inplace(_functional))


@runtime_handler("aten::resize_")
def resize_(op, args, kwargs):
    self, size = args[0], tuple(args[1])
    need = math.prod(size)
    st = self._tpu_storage
    if need <= st.numel - self.storage_offset():
        view = TpuTensor(st, size, strided.contiguous_strides(size), self.storage_offset(), self.dtype)
        return repoint(self, view)
    # a bigger storage keeps the old elements first, as torch's reallocation does (views
    # taken before keep the old storage here, where in torch they would share the new one)
    flat = concrete(st.array).reshape(-1)   # (a placeholder: deferred, or a graph's packed state)
    grown = jnp.concatenate([flat, jnp.zeros((self.storage_offset() + need - flat.size,), flat.dtype)])
    return repoint(self, TpuTensor(Storage(grown), size, strided.contiguous_strides(size),
                                   self.storage_offset(), self.dtype))


@runtime_handler("aten::set_.source_Tensor")
def set_source(op, args, kwargs):
    """``self.set_(source)``: ``self`` becomes ``source``'s view of its storage, sharing it
    (writes through either are seen by both), as in torch."""
    self, source = args[0], args[1]
    meta_call(op, args, kwargs)   # torch's checks and words (a dtype mismatch)
    view = TpuTensor(source._tpu_storage, tuple(source.shape), source.stride(), source.storage_offset(),
                     source.dtype)
    return repoint(self, view)


@runtime_handler("aten::set_.default")
def set_empty(op, args, kwargs):
    """``self.set_()``: an empty tensor over a new, empty storage."""
    self, i = args[0], args[0]._tpu_storage.index
    return repoint(self, TpuTensor(Storage(to_jax(torch.empty(0, dtype=self.dtype), i), i), (0,), (1,), 0, self.dtype))


@runtime_handler("aten::is_set_to")
def is_set_to(op, args, kwargs):
    """Whether both tensors are the same view of one storage."""
    a, b = args[0], args[1]
    return (isinstance(b, TpuTensor) and a._tpu_storage is b._tpu_storage and a.storage_offset() == b.storage_offset()
            and a.shape == b.shape and a.stride() == b.stride())


@runtime_handler("aten::resize_as_")
def resize_as_(op, args, kwargs):
    return resize_(op, (args[0], tuple(args[1].shape)), {})


@runtime_handler("aten::_has_compatible_shallow_copy_type")
def compatible_shallow_copy(op, args, kwargs):
    """``t.data = other`` asks this: tpu tensors swap metadata among themselves."""
    return all(isinstance(a, TpuTensor) for a in args[:2])


@runtime_handler("aten::detach_")
def detach_(op, args, kwargs):
    """Autograd's own work (handled above the device), except where autograd's keys are
    off (inference mode), which hands the call here: the tensor itself."""
    return args[0]
