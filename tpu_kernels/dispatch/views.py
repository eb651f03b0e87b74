"""View ops: a new tpu tensor over its base's storage with the geometry torch's meta
function gives (the runtime's handler of every op whose schema returns a view)."""
from __future__ import annotations

from typing import Any, Callable

import jax
import torch

from tpu_kernels.dispatch import cache
from tpu_kernels.dispatch.meta import meta_call
from tpu_kernels.dispatch.devices import device_error
from tpu_kernels.dispatch.signature import freeze
from tpu_kernels.tensor import TpuTensor, value, wrap

aten = torch.ops.aten

# A complex <-> real view changes the item size, and conj/neg views are lazy bits torch
# resolves later; the storage holds plain values of one dtype, so these views are
# computed as new tensors: they do not alias their base.
REINTERPRET: dict[Any, Callable] = {
    aten.view_as_real.default: lambda z: jax.numpy.stack([z.real, z.imag], axis=-1),
    aten.view_as_complex.default: lambda x: jax.lax.complex(x[..., 0], x[..., 1]),
    aten._conj.default: jax.numpy.conj,
    aten._neg_view.default: jax.numpy.negative,
}


def run_view(op, args: tuple, kwargs: dict) -> Any:
    base = args[0]
    if not isinstance(base, TpuTensor):
        raise device_error(op, base)
    reinterpret = REINTERPRET.get(op)
    if reinterpret is not None:
        return wrap(reinterpret(value(base)))
    key = (op, tuple(base.shape), base.stride(), base.storage_offset(), base._tpu_storage.numel,
           base.dtype, freeze(list(args[1:])), freeze(list(kwargs.items())))
    metas = cache.VIEWS.get(key)
    if metas is None:
        metas = cache.VIEWS.put(key, meta_call(op, args, kwargs))
    if op is aten.view.dtype and metas.dtype.itemsize != base.dtype.itemsize:
        raise NotImplementedError(f"{op}: viewing {base.dtype} as {metas.dtype} (different item size) is not supported on tpu")
    return _view_like(base, metas)


def _view_like(base: TpuTensor, m: Any) -> Any:
    if isinstance(m, (list, tuple)):
        return type(m)(_view_like(base, x) for x in m)
    return TpuTensor(base._tpu_storage, m.shape, m.stride(), m.storage_offset(), m.dtype)
