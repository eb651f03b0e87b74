"""How a compiled program's outputs leave it: which storages its jit returns and how each
output is cut from them (``output_layout``, settled when the graph is traced), and an
output as a raw (storage, geometry) source or a CPU tensor where a tpu tensor is not
what the caller takes."""
from __future__ import annotations

import collections
from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

from tpu_kernels import shadow, strided
from tpu_kernels.graph_packing import MAX_MEMBER_BYTES
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.storage import Storage
from tpu_kernels.tensor import TpuTensor


def output_layout(inputs: list[Storage], arrays: tuple, result: Any,
                   host_written: Any = ()) -> tuple[list, tuple]:
    """Which storages leave the jit and how the outputs are cut from them: an output that
    is a view of an input stays one (geometry over the real input's storage); outputs
    sharing a new storage keep sharing it; inputs whose storage changed are written,
    except those at ``host_written`` (positions the host updates)."""
    storages: list = []
    slots: dict[int, int] = {}

    def slot(st: Storage) -> int:
        if id(st) not in slots:
            slots[id(st)] = len(storages)
            storages.append(st.array)
        return slots[id(st)]

    written = [(k, slot(st)) for k, (st, a) in enumerate(zip(inputs, arrays))
               if st.array is not a and k not in host_written]
    layout = []
    shared = collections.Counter(id(o._tpu_storage) for o in result if isinstance(o, TpuTensor))
    for o in result:
        if not isinstance(o, TpuTensor):
            layout.append(("value", o))
            continue
        st, geometry = o._tpu_storage, shadow.geometry(o)
        k = next((k for k, s in enumerate(inputs) if s is st), None)
        empty = o.numel() == 0     # (TpuTensor gives an empty tensor a torch storage)
        nbytes = int(st.array.size) * np.dtype(st.array.dtype).itemsize
        if k is not None:
            # (the input's storage is known only at the call: whether the view is all of
            # it is settled there, from whether it has a whole-storage layout and its dtype)
            whole = geometry[2] == 0 and geometry[1] == strided.contiguous_strides(geometry[0])
            layout.append(("input", k, geometry, None if empty else (whole, np.dtype(to_jax_dtype(geometry[3])))))
        elif o._tpu_direct and shared[id(st)] == 1 and not empty and id(st) not in slots:
            # rebuilt without recomputing its layout: (size, strides, dtype, bytes)
            layout.append(("whole", slot(st), (geometry[0], geometry[1], geometry[3], nbytes), None))
        else:
            layout.append(("new", slot(st), geometry, (None if empty else o._tpu_direct, nbytes)))
    return storages, (written, layout)


def pack_saved(result: list, start: int, inputs: list[Storage]) -> list:
    """``result`` with its outputs from ``start`` on that live in small new storages (the
    activations a training graph's forward saves for its backward: layer norm statistics,
    attention's log-sum-exps, masks) cut from one flat buffer per dtype: one output of the
    program instead of one each. On the TPU v5e host an output costs ~5.5 µs and an input
    ~1 µs (``bench/call_anatomy.py``); the backward program takes each member as a view of
    the buffer, cut inside XLA. Members: storages of at most
    ``graph_packing.MAX_MEMBER_BYTES`` that are no input's and no earlier output's (all
    their views are saved values), two or more per dtype."""
    keep = {id(st) for st in inputs}
    keep.update(id(o._tpu_storage) for o in result[:start] if isinstance(o, TpuTensor))
    for o in result[start:]:    # (a view of another dtype counts its offset in that dtype)
        if type(o) is TpuTensor and np.dtype(to_jax_dtype(o.dtype)) != o._tpu_storage.array.dtype:
            keep.add(id(o._tpu_storage))
    groups: dict[Any, dict[int, Storage]] = collections.defaultdict(dict)
    for o in result[start:]:
        if type(o) is not TpuTensor or o.numel() == 0:
            continue
        st = o._tpu_storage
        if id(st) not in keep and st.array.nbytes <= MAX_MEMBER_BYTES:
            groups[st.array.dtype][id(st)] = st
    out = list(result)
    for members in groups.values():
        if len(members) < 2:
            continue
        pack = Storage(jnp.concatenate([st.array.reshape(-1) for st in members.values()]))
        base, offset = {}, 0
        for k, st in members.items():
            base[k], offset = offset, offset + st.array.size
        for i in range(start, len(result)):
            o = result[i]
            if type(o) is TpuTensor and id(o._tpu_storage) in base:
                out[i] = TpuTensor(pack, tuple(o.shape), o.stride(),
                                   base[id(o._tpu_storage)] + o.storage_offset(), o.dtype)
    return out


def tensor_of(source: tuple) -> TpuTensor:
    """The tpu tensor of a (storage, geometry) source."""
    storage, geometry = source
    return TpuTensor(storage, *geometry)


def on_cpu(out: Any) -> torch.Tensor:
    """An output torch expects on the CPU (``out`` a tpu tensor or a raw source)."""
    return (tensor_of(out) if type(out) is tuple else out).cpu()


def source_of_output(entry: tuple, sources: list, arrays: list, new: dict) -> Any:
    """An output of ``_results``'s layout as the (storage, geometry) a program's input
    takes (``source_of``), with no tensor made; ``new``: the call's new storages."""
    if entry[0] == "value":
        return entry[1]
    kind, where, geometry, known = entry
    if kind == "whole":     # (size, strides, dtype, bytes)
        return Storage(arrays[where], None, geometry[3]), (geometry[0], geometry[1], 0, geometry[2])
    if kind == "input":
        return sources[where][0], geometry
    return new.get(where) or new.setdefault(where, Storage(arrays[where], None, known[1])), geometry
