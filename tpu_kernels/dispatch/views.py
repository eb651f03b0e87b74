"""View ops: a new tpu tensor over its base's storage with the geometry torch's meta
function gives (the runtime's handler of every op whose schema returns a view)."""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import numpy as np
import torch
from jax import lax

from tpu_kernels.dispatch import cache
from tpu_kernels.dispatch.meta import meta_call
from tpu_kernels.dispatch.devices import device_error
from tpu_kernels.dispatch.signature import freeze
from tpu_kernels.fast_tokens import fast_token
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.storage import _bitcast, link
from tpu_kernels.tensor import TpuTensor, wrap, wrap_view
from tpu_kernels.tensor_values import value
aten = torch.ops.aten

# A complex <-> real view changes the item size, and conj/neg views are lazy bits torch
# resolves later; the storage holds plain values of one dtype, so each of these views is a
# copy in a storage of its own, linked to its base's view (``storage.link``): a write to
# either rewrites the other, as torch's aliasing would. (forward, inverse) per op.
def _as_real(z):
    return jax.numpy.stack([z.real, z.imag], axis=-1)


def _as_complex(x):
    return jax.lax.complex(x[..., 0], x[..., 1])


REINTERPRET: dict[Any, tuple[Callable, Callable]] = {
    aten.view_as_real.default: (jax.jit(_as_real), jax.jit(_as_complex)),
    aten.view_as_complex.default: (jax.jit(_as_complex), jax.jit(_as_real)),
    aten._conj.default: (jax.jit(jax.numpy.conj),) * 2,
    aten._neg_view.default: (jax.jit(jax.numpy.negative),) * 2,
}


def run_view(op, args: tuple, kwargs: dict) -> Any:
    base = args[0]
    if base.is_inference() != _inference_mode():
        return _view_in_mode(op, args, kwargs)
    fast = _fast_key(op, base, args) if type(base) is TpuTensor and not kwargs else None
    if fast is not None:
        hit = cache.FAST_VIEWS.get(fast)
        if hit is not None:
            return _new_view(base._tpu_storage, *hit)
    if not isinstance(base, TpuTensor):
        raise device_error(op, base)
    key = (op, tuple(base.shape), base.stride(), base.storage_offset(), base._tpu_storage.numel,
           base.dtype, freeze(list(args[1:])), freeze(list(kwargs.items())))
    metas = cache.VIEWS.get(key)
    if metas is None:   # (torch's checks: view_as_complex's last dim, as_strided's bounds)
        metas = meta_call(op, args, kwargs)
        if op is aten.as_strided.default:
            _check_in_storage(base, metas)
        metas = cache.VIEWS.put(key, metas)
    reinterpret = REINTERPRET.get(op)
    if reinterpret is not None:
        return _linked_copy(base, *reinterpret)
    if op is aten.view.dtype and metas.dtype.itemsize != base.dtype.itemsize:
        return _bit_view(op, base, metas.dtype)
    out = _view_like(base, metas)
    # (an empty view keeps TpuTensor's one-element torch storage: not indexed)
    if fast is not None and type(out) is TpuTensor and out.numel():
        if len(cache.FAST_VIEWS) >= _MAX_FAST_VIEWS:   # dynamic shapes: start over
            cache.FAST_VIEWS.clear()
        cache.FAST_VIEWS[fast] = (tuple(out.shape), out.stride(), out.storage_offset(), out.dtype,
                                  out._tpu_direct, fast_token(out))
    return out


def _bit_view(op: Any, base: TpuTensor, dtype: torch.dtype) -> TpuTensor:
    """``base.view(dtype)`` of another item size (torch checked the geometry: the last
    dimension contiguous, sizes and strides divisible): its bytes read as ``dtype``, the
    last dimension scaled, in a storage of its own linked to ``base`` as the complex
    views are (a write to either rewrites the other)."""
    if base.dtype.is_complex or dtype.is_complex:
        raise NotImplementedError(f"{op}: viewing {base.dtype} as {dtype} (different item size, "
                                  "complex) is not supported on tpu; use torch.view_as_real")
    forward, inverse = _bit_views(np.dtype(to_jax_dtype(base.dtype)), np.dtype(to_jax_dtype(dtype)))
    return _linked_copy(base, forward, inverse, dtype)


def _linked_copy(base: TpuTensor, forward: Callable, inverse: Callable,
                 dtype: torch.dtype | None = None) -> TpuTensor:
    """``forward`` of ``base``'s value in a storage of its own, kept equal to ``base``'s
    view both ways (``storage.link``; ``inverse`` maps it back)."""
    out = wrap(forward(value(base)), dtype)
    view = (tuple(base.shape), base.stride(), base.storage_offset(), base.dtype, base._tpu_direct)
    link(base._tpu_storage, view, out._tpu_storage, forward, inverse)
    return out


@functools.lru_cache(maxsize=64)
def _bit_views(have: np.dtype, want: np.dtype) -> tuple[Callable, Callable]:
    """(forward, inverse): an array's last dimension of ``have`` items read as ``want``
    items, and back (little-endian, as torch's memory)."""
    return jax.jit(functools.partial(_bits_as, want=want)), jax.jit(functools.partial(_bits_as, want=have))


def _bits_as(a: jax.Array, want: np.dtype) -> jax.Array:
    # bools travel as bytes, by the same-size bit-cast's rule (``storage._bitcast``)
    if a.dtype == np.bool_:
        a = _bitcast(a, np.dtype(np.uint8))
    cast = np.dtype(np.uint8) if want == np.bool_ else want
    have = np.dtype(a.dtype)
    if cast.itemsize < have.itemsize:     # (..., n) -> (..., n, r) -> (..., n * r)
        out = lax.bitcast_convert_type(a, cast)
        out = out.reshape(*a.shape[:-1], a.shape[-1] * (have.itemsize // cast.itemsize))
    else:                                 # (..., n * r) -> (..., n, r) -> (..., n)
        r = cast.itemsize // have.itemsize
        out = lax.bitcast_convert_type(a.reshape(*a.shape[:-1], a.shape[-1] // r, r), cast)
    return _bitcast(out, want) if want == np.bool_ else out


def _check_in_storage(base: TpuTensor, view: torch.Tensor) -> None:
    """torch's bounds check of ``as_strided``: the view must lie inside its base's storage
    (XLA would read zeros, or clamp, past its end)."""
    size, stride, offset = tuple(view.shape), view.stride(), view.storage_offset()
    itemsize = view.dtype.itemsize
    span = 0 if 0 in size else offset + 1 + sum(st * (n - 1) for n, st in zip(size, stride))
    have = base._tpu_storage.numel * base._tpu_storage.array.dtype.itemsize
    if span * itemsize > have:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and "
            f"itemsize {itemsize} requiring a storage size of {span * itemsize} are out of bounds "
            f"for storage of size {have}")


def _view_in_mode(op, args: tuple, kwargs: dict) -> Any:
    """A view made under the mode of its base, as torch makes it: a view of a normal tensor
    is normal (sharing its base's version counter) also under inference mode, and a view of
    an inference tensor is an inference tensor also outside it (so torch refuses in-place
    updates and saving it for backward there)."""
    with torch.inference_mode(args[0].is_inference()):
        return run_view(op, args, kwargs)


_MAX_FAST_VIEWS = 1 << 16


_inference_mode = torch.is_inference_mode_enabled


def _fast_key(op: Any, base: TpuTensor, args: tuple) -> tuple | None:
    """The FAST_VIEWS key of a view of ``base`` whose other arguments are ints or int
    lists (``view``, ``t``, ``transpose``, ``permute``, ``select``, ``slice``, ``expand``,
    ``unsqueeze``...), or None. The base's geometry token stands for its sizes, dtype,
    device and (a view) strides and offset; with its storage array's shape and dtype, the
    view's geometry and whether it is the whole storage follow."""
    storage = base._tpu_storage
    if storage is None:      # a traced tensor
        return None
    tok, st = base._tpu_fk, storage.array
    key = [op, fast_token(base) if tok is None else tok, st.shape, st.dtype]
    for a in args[1:]:
        t = type(a)
        if t is int:
            key.append(a)
        elif t is list or t is tuple:
            for x in a:
                if type(x) is not int:
                    return None
            key.append(tuple(a))
        elif a is None:
            key.append(None)
        else:
            return None
    return tuple(key)


def _new_view(storage: Any, size: tuple, stride: tuple, offset: int, dtype: torch.dtype,
              direct: bool, token: int) -> TpuTensor:
    """``TpuTensor(storage, ...)`` with everything known (a FAST_VIEWS hit)."""
    r = wrap_view(storage, size, stride, offset, dtype, direct)
    r._tpu_fk = token
    return r


def _view_like(base: TpuTensor, m: Any) -> Any:
    if isinstance(m, (list, tuple)):
        return type(m)(_view_like(base, x) for x in m)
    return TpuTensor(base._tpu_storage, m.shape, m.stride(), m.storage_offset(), m.dtype)
