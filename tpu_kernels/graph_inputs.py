"""A compiled graph's tensor arguments as its program's arrays.

``source_of``: the storage and view geometry behind an argument (a tpu tensor, a shadow,
or a CPU tensor read as a host array). ``HostScalars``: the 0-dim CPU inputs (CPU scalar
arguments, a custom optimizer's CPU step counters) as one host array per dtype.

A jit call pays per argument, and most for a host array, which it copies to the device
one by one: in one measurement, 116 device arguments and 29 host scalars cost 308 µs a
call, the same with the scalars as one host array 174 µs (the small GPT's compiled AdamW
step took 29 step counters; torch's optimizers now count on the device when compiled, see
``optim_defaults.py``). Packed, each dtype's scalars cross as one array, and the
program takes them apart again before anything reads them, so the graph sees what it
saw before.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import numpy as np
import torch

from tpu_kernels import shadow, strided
from tpu_kernels.storage import Storage, to_jax
from tpu_kernels.tensor import TpuTensor
from tpu_kernels.tensor_values import source as tensor_source
# dtypes packed (as their numpy type): bfloat16 and complex scalars keep their own path
_PACKABLE = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
             torch.int32: np.int32, torch.bool: np.bool_}


def source_of(x: torch.Tensor | tuple) -> tuple[Storage, tuple]:
    """The storage and view geometry behind a compiled graph's tensor argument: a tpu
    tensor, a shadow (whose tensor may be gone), a CPU tensor (a host array), or a
    (storage, geometry) source itself."""
    if isinstance(x, TpuTensor):
        return tensor_source(x)
    if x is None:    # an effect token (runtime_ops/effects.py): AOTAutograd passes None
        return _token()
    if type(x) is tuple:     # already a source: a forward program's raw output (raw_from)
        return x
    src = shadow.source(x)
    if src is not None:
        return src
    if x.device.type == "cpu":      # 0-dim scalars, step counters: they ride along
        return _host(x)
    raise RuntimeError(
        f"a compiled tpu graph got a tensor it cannot read (shape {tuple(x.shape)}, "
        f"{x.dtype}, device {x.device}): only tpu and CPU tensors can be its inputs")


def _token() -> tuple[Storage, tuple]:
    """The source of an effect token: an empty array (each call its own storage)."""
    return Storage(_empty_token(), 0, 0), ((0,), (1,), 0, torch.float32)


@functools.cache
def _empty_token() -> Any:
    return np.zeros(0, np.float32)


def _host(t: torch.Tensor) -> tuple[Storage, tuple]:
    """A CPU tensor as a storage over a host array (jit moves it with the call) and its
    contiguous geometry; no tpu tensor is made (an optimizer has one step counter a parameter)."""
    shape = tuple(t.shape)
    if t.dtype == torch.bfloat16 or not t.is_contiguous() or t.is_conj() or t.is_neg():
        st = Storage(to_jax(t))
    else:   # a host array: nothing to look up (device 0, as ``index_of_array`` says)
        # a copy: the program may run after the call returns (XLA:CPU dispatches async and
        # can read host memory in place), and the caller may write the tensor by then (an
        # lr scheduler's ``fill_`` of a tensor learning rate made a step read the next lr)
        array = t.detach().numpy().copy()
        st = Storage(array, 0, array.nbytes)
    return st, (shape, strided.contiguous_strides(shape), 0, t.dtype)


class HostScalars:
    """Where a program's packed inputs go: ``pack`` builds the jit's arguments from the
    tensor inputs' arrays, ``unpack`` (inside the trace) gives them back in order."""

    def __init__(self, positions: list[int], dtypes: list[Any], n_inputs: int) -> None:
        groups: dict[Any, list[int]] = {}
        for k, dt in zip(positions, dtypes):
            groups.setdefault(dt, []).append(k)
        self.groups = list(groups.items())        # (numpy dtype, input positions)
        packed = set(positions)
        self.direct = [k for k in range(n_inputs) if k not in packed]
        self.where = {k: i for i, k in enumerate(self.direct)}   # an unpacked input's argument

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor]) -> "HostScalars | None":
        """The packing for a program whose tensor inputs look like ``tensors`` (its example
        inputs; Dynamo guards their devices, shapes and dtypes), or None if fewer than two
        inputs would be packed."""
        at = [k for k, t in enumerate(tensors)
              if t.device.type == "cpu" and t.dim() == 0 and t.dtype in _PACKABLE]
        if len(at) < 2:
            return None
        return cls(at, [_PACKABLE[tensors[k].dtype] for k in at], len(tensors))

    def pack(self, arrays: Sequence[Any]) -> list[Any]:
        """The jit's arguments: the unpacked inputs in order, then one array per dtype
        (abstract ones, ``jax.ShapeDtypeStruct``, for a lowering)."""
        out = [arrays[k] for k in self.direct]
        for dt, ks in self.groups:
            first = arrays[ks[0]]
            if isinstance(first, jax.ShapeDtypeStruct):
                out.append(jax.ShapeDtypeStruct((len(ks),), first.dtype, sharding=first.sharding))
            else:
                out.append(np.array([arrays[k] for k in ks], dt))
        return out

    def unpack(self, args: Sequence[Any]) -> list[Any]:
        """The tensor inputs' arrays in their order, from the jit's (traced) arguments."""
        n = len(self.direct)
        full: list[Any] = [None] * (n + sum(len(ks) for _, ks in self.groups))
        for i, k in enumerate(self.direct):
            full[k] = args[i]
        for g, (_, ks) in enumerate(self.groups):
            for j, k in enumerate(ks):
                full[k] = args[n + g][j]
        return full
