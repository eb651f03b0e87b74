"""``torch.empty`` on tpu without a program to compile.

Every CPU -> tpu move (``t.to("tpu")``, ``torch.tensor(data, device="tpu")``) starts with an
``empty`` of the destination's shape, then copies into it. Through the registry that
``empty`` is an XLA program of its own, compiled once per new shape and dtype (tens of ms
each on XLA:CPU): a model's first ``.to("tpu")`` compiled one per parameter shape, and the
copy then replaced the zeros anyway. Its values are unspecified, so the first
``HOST_CALLS`` empties of a signature are made here from host zeros instead (zeroed,
deterministic, as the registry's impl makes them). Later calls take the registry's
program: compiled once, then cheaper per call than sending zeros from the host (a loader
moving one batch shape every step pays one compile; a model's moves, a few per shape,
none).

Only in plain eager: a traced or recorded ``empty`` stays an op of its program. A layout
with gaps between elements (``empty_strided``) always comes from the host: the registry's
program makes a contiguous tensor, not torch's strides and storage size.
"""
from __future__ import annotations

import torch

from tpu_kernels import devices, lazy, strided
from tpu_kernels.dispatch import graph_trace, run_call
from tpu_kernels.dispatch.results import wrap_result
from tpu_kernels.lru import LRU
from tpu_kernels.registry import runtime_handler
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.storage import Storage, to_jax
from tpu_kernels.tensor import TpuTensor

HOST_MAX_BYTES = 1 << 22   # 4 MiB: an empty bigger than this is cheaper compiled than sent
# per signature: a compile (tens of ms) costs as much as about a thousand host-made empties
# (tens of us more each than a compiled one's call)
HOST_CALLS = 64
_MADE = LRU()              # dense signature -> the empties made of it from the host
_STRIDED = torch.ops.aten.empty_strided.default


@runtime_handler("aten::empty.memory_format", "aten::empty_strided", "aten::empty_permuted")
def empty(op, args, kwargs):
    if graph_trace.active() is not None or lazy.recording():
        return run_call(op, args, kwargs)
    index = devices.index(kwargs.get("device"))
    gaps = op is _STRIDED and strided.memory_order(tuple(args[0]), tuple(args[1])) is None
    key = (op, *(tuple(a) if isinstance(a, (list, tuple)) else a for a in args), *kwargs.items(), index)
    made = _MADE.get(key) or 0
    if not gaps and made >= HOST_CALLS:
        return run_call(op, args, kwargs)
    meta = op(*args, **{**kwargs, "device": "meta", "pin_memory": None})
    to_jax_dtype(meta.dtype)   # torch's dtypes JAX lacks (float8, complex32) raise here, by name
    if gaps:   # a flat storage, viewed
        flat = torch.zeros(meta.untyped_storage().nbytes() // meta.element_size(), dtype=meta.dtype)
        return TpuTensor(Storage(to_jax(flat, index), index), tuple(meta.shape), meta.stride(), 0, meta.dtype)
    if meta.untyped_storage().nbytes() > HOST_MAX_BYTES:
        _MADE.put(key, HOST_CALLS)
        return run_call(op, args, kwargs)
    _MADE.put(key, made + 1)
    shape = tuple(meta.shape)
    order = strided.memory_order(shape, meta.stride()) or range(len(shape))   # (None: size 0)
    # zeros in the result's memory order: ``wrap_result`` takes them as its storage as laid out
    host = torch.zeros([shape[d] for d in order], dtype=meta.dtype)
    return wrap_result(to_jax(host, index), meta, laid_out=True)
