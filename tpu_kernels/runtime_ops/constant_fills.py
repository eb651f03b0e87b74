"""Small constant fills (``zeros``, ``ones``, ``full`` and their ``_like``/``new_`` forms,
``scalar_tensor``) without a device launch.

``loss.backward()`` starts from ``torch.ones_like(loss)``, an optimizer's state from
``torch.zeros_like(p)``, model code makes masks and scalars with ``torch.full``: each an
executable launch of its own (on a TPU v5e host about 110 µs, as much as a small compiled
program; here 13-15 µs against 3 for this path). A fill's value depends only on its
arguments, and a jax array is immutable: so the first plain-eager fill of a signature runs
as before and keeps its result's array, and later fills of the same signature get a new
tpu tensor (a storage of its own) over that array. Writing one replaces its storage's
array, never the shared one, and a compiled program donates a storage's array only when
nothing else holds it (``graph_program``), so the kept array is never given up. (A
user's own jitted function that donates ``t.jax()`` gives it up, for every fill sharing it
as for ``t``: copy before donating. A kept array found deleted is made again.)

Only contiguous fills of at most ``MAX_BYTES`` are kept (``MAX_FILLS`` signatures, least
recently used first out), in plain eager only: traced, recorded or captured, a fill stays
an op of its program.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from tpu_kernels import devices, lazy
from tpu_kernels.dispatch import graph_trace, run_call
from tpu_kernels.lru import LRU
from tpu_kernels.registry import runtime_handler
from tpu_kernels.tensor import TpuTensor, wrap_known

MAX_BYTES = 1 << 16    # 64 KiB: the arrays kept stay small (at most MAX_FILLS * MAX_BYTES)
MAX_FILLS = 256
_KEPT = LRU(MAX_FILLS)  # signature -> (array, size, stride, dtype, nbytes, device index)

FILLS = ("aten::zeros", "aten::ones", "aten::full", "aten::zeros_like", "aten::ones_like",
         "aten::full_like", "aten::new_zeros", "aten::new_ones", "aten::new_full",
         "aten::scalar_tensor")


@runtime_handler(*FILLS)
def constant_fill(op: Any, args: tuple, kwargs: dict) -> Any:
    if graph_trace.active() is not None or lazy.recording() or lazy.capturing():
        return run_call(op, args, kwargs)
    key = _signature(op, args, kwargs)
    if key is not None:
        kept = _KEPT.get(key)
        # (deleted: a jitted function the user gave ``t.jax()`` to donated it)
        if kept is not None and not kept[0].is_deleted():
            return wrap_known(*kept)
    out = run_call(op, args, kwargs)
    if key is not None and type(out) is TpuTensor:
        _keep(key, out)
    return out


def _keep(key: tuple, out: TpuTensor) -> None:
    st = out._tpu_storage
    nbytes = out.numel() * out.element_size()
    # (one device's plain array only: a fill laid out over a mesh keeps its own layout)
    if (0 < nbytes <= MAX_BYTES and out._tpu_direct and out.is_contiguous() and st.placement is None
            and type(st.array) is not lazy.Lazy and tuple(st.array.shape) == tuple(out.shape)
            and len(st.array.devices()) == 1):
        _KEPT.put(key, (st.array, tuple(out.shape), out.stride(), out.dtype, st.nbytes, st.index))


def _signature(op: Any, args: tuple, kwargs: dict) -> tuple | None:
    """What a fill's result depends on, hashable, or None (a NaN fill, an argument of a
    kind not keyed: not kept)."""
    key = [op, torch.get_default_dtype(), devices.current_device()]   # (where device="tpu" goes)
    for a in (*args, *kwargs.items()):
        k = _part(a)
        if k is None:
            return None
        key.append(k)
    return tuple(key)


def _part(a: Any) -> Any:
    t = type(a)
    if t is TpuTensor:   # a *_like/new_* fill's input: its dtype, geometry and device index
        st = a._tpu_storage
        return None if st is None else (a.dtype, a.shape, a.stride(), st.index)
    if t is float:       # -0.0 and 0.0 are equal keys, different fills; NaN equals nothing
        return None if a != a else (t, a, math.copysign(1.0, a))
    if t is tuple and len(a) == 2 and type(a[0]) is str:    # a keyword argument
        v = _part(a[1])
        return None if v is None else (a[0], v)
    if t is list or t is tuple or t is torch.Size:
        parts = tuple(_part(x) for x in a)
        return None if None in parts else (tuple, parts)
    if a is None or t in (int, bool, str, torch.dtype, torch.device, torch.layout, torch.memory_format):
        return (t, a)
    return None
