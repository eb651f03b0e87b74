"""``torch.empty`` on tpu without a program to compile.

Every CPU -> tpu move (``t.to("tpu")``, ``torch.tensor(data, device="tpu")``) starts with an
``empty`` of the destination's shape, then copies into it. Through the registry that
``empty`` is an XLA program of its own, compiled once per new shape and dtype (tens of ms
each on XLA:CPU): a model's first ``.to("tpu")`` compiled one per parameter shape, and the
copy then replaced the zeros anyway. Its values are unspecified, so it is made here from
host zeros instead (zeroed, deterministic, as the registry's impl makes them).

Only in plain eager and up to ``HOST_MAX_BYTES``: a traced or recorded ``empty`` stays an op
of its program, and a big one is cheaper filled on the device than sent from the host.
"""
from __future__ import annotations

import torch

from tpu_kernels import devices, lazy, strided
from tpu_kernels.dispatch import graph_trace, run_call
from tpu_kernels.dispatch.results import wrap_result
from tpu_kernels.registry import runtime_handler
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.storage import Storage, to_jax
from tpu_kernels.tensor import TpuTensor

HOST_MAX_BYTES = 1 << 22   # 4 MiB: well under a compile's cost to send from the host


@runtime_handler("aten::empty.memory_format", "aten::empty_strided", "aten::empty_permuted")
def empty(op, args, kwargs):
    if graph_trace.active() is not None or lazy.recording():
        return run_call(op, args, kwargs)
    meta = op(*args, **{**kwargs, "device": "meta", "pin_memory": None})
    to_jax_dtype(meta.dtype)   # torch's dtypes JAX lacks (float8, complex32) raise here, by name
    if meta.untyped_storage().nbytes() > HOST_MAX_BYTES:
        return run_call(op, args, kwargs)
    shape, stride, index = tuple(meta.shape), meta.stride(), devices.index(kwargs.get("device"))
    order = strided.memory_order(shape, stride)
    if order is None:   # gaps between elements (``empty_strided``): a flat storage, viewed
        flat = torch.zeros(meta.untyped_storage().nbytes() // meta.element_size(), dtype=meta.dtype)
        return TpuTensor(Storage(to_jax(flat, index), index), shape, stride, 0, meta.dtype)
    # zeros in the result's memory order: ``wrap_result`` takes them as its storage as laid out
    host = torch.zeros([shape[d] for d in order], dtype=meta.dtype)
    return wrap_result(to_jax(host, index), meta, laid_out=True)
