"""The tpu tensor: a torch wrapper subclass over a shared storage holding a jax.Array.

Like torch, a tensor is (storage, sizes, strides, storage offset). Views share the
storage; an in-place op writes into it and bumps its version, so every view sees the
change. Values are read through ``strided.reader`` and cached per storage version.
"""
from __future__ import annotations

import functools
import math
import threading

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tpu_kernels import errors, strided, traced
from tpu_kernels.deferred_mode import Lazy, apply, force, recording
from tpu_kernels.registry.dtypes import to_jax_dtype

DEVICE = torch.device("tpu", 0)


class Storage:
    """A mutable box for one jax array; views of one base share it."""
    __slots__ = ("array", "version", "shadow", "__weakref__")

    def __init__(self, array: jax.Array) -> None:
        self.array = array
        self.version = 0
        self.shadow = None   # a memory-less torch storage standing for it under torch.compile

    @property
    def numel(self) -> int:
        return self.array.size


class TpuTensor(torch.Tensor):
    """A tensor on the ``tpu`` device. Use ``t.jax()`` for its value as a jax.Array."""
    _tpu_storage: Storage
    _tpu_direct: bool          # the tensor is its storage's whole array, same shape
    _tpu_cache: tuple[int, jax.Array] | None

    @staticmethod
    def __new__(cls, storage: Storage, size, stride=None, offset: int = 0,
                dtype: torch.dtype | None = None, requires_grad: bool = False):
        size = tuple(size)
        stride = strided.contiguous_strides(size) if stride is None else tuple(stride)
        dtype = dtype if dtype is not None else _torch_dtype_of(storage.array)
        # never an empty torch storage for an empty tensor: torch.compile would resize it
        extra = {"storage_size": 1} if 0 in size else {}
        r = torch.Tensor._make_wrapper_subclass(
            cls, size, strides=stride, storage_offset=offset, dtype=dtype, device=DEVICE,
            requires_grad=requires_grad, **extra)
        r._tpu_storage = storage
        r._tpu_direct = (offset == 0 and size == tuple(storage.array.shape)
                         and stride == strided.contiguous_strides(size))
        r._tpu_cache = None
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # inside torch.compile's tracing (the scan is skipped on eager's hot path)
        if torch.compiler.is_compiling() and traced.is_traced(args, kwargs, cls):
            return traced.run(cls, func, args, kwargs)
        try:
            return dispatch.entry(func, args, kwargs)
        except Exception as exc:
            if not errors.on_worker_thread():
                raise
            return dispatch.defer_error(func, args, kwargs, exc)

    # torch.compile takes tpu tensors apart into one memory-less shadow (see traced.py)
    def __tensor_flatten__(self):
        return ["_tpu_shadow"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return traced.unflatten(TpuTensor, inner["_tpu_shadow"], outer_size, outer_stride)

    @property
    def _tpu_shadow(self) -> torch.Tensor:
        return traced.shadow(self)

    def jax(self) -> jax.Array:
        """This tensor's value as a jax.Array (a copy-free read where the layout allows)."""
        return value(self)

    def numpy(self, *, force: bool = False):  # noqa: D102
        if force:
            return self.cpu().numpy()
        raise TypeError(
            "can't convert tpu:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
            "tensor to host memory first.")

    def tolist(self):  # noqa: D102  (torch refuses tolist on subclasses)
        return self.cpu().tolist()

    def __repr__(self, *, tensor_contents=None) -> str:
        if self._tpu_storage is None:   # traced by torch.compile: no values yet
            return f"TpuTensor(traced, shape={tuple(self.shape)}, dtype={self.dtype})"
        from tpu_kernels.printing import tensor_repr
        return tensor_repr(self)

    __str__ = __repr__

    def __reduce_ex__(self, proto):
        return (_rebuild, (self.detach().cpu(), self.requires_grad))


def _rebuild(cpu: torch.Tensor, requires_grad: bool) -> TpuTensor:
    t = cpu.to(DEVICE)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _torch_dtype_of(array) -> torch.dtype:
    from tpu_kernels.registry.dtypes import to_torch_dtype
    return to_torch_dtype(array.dtype)


def wrap(array: jax.Array, dtype: torch.dtype | None = None) -> TpuTensor:
    """A new tpu tensor owning ``array`` (contiguous)."""
    return TpuTensor(Storage(array), array.shape, None, 0, dtype)


class _Layouts(threading.local):
    torch_strides = False   # True while a compiled graph is traced (graph_program)


LAYOUTS = _Layouts()


def wrap_result(array: jax.Array, meta: torch.Tensor) -> TpuTensor:
    """An op's result, with the strides torch's meta function gave: a compiled graph's later
    views (recorded by AOTAutograd against those strides) and DTensor (which keeps the
    meta's strides as the global tensor's and views local tensors by them) must cut the
    same elements. Nearly every result is contiguous; attention outputs and their
    gradients are not (they follow the query's layout, as torch's kernels do)."""
    stride = meta.stride()
    if stride == strided.contiguous_strides(tuple(array.shape)):
        return wrap(array, meta.dtype)
    order = strided.memory_order(tuple(array.shape), stride)
    if order is None:   # not a dense layout (torch's meta functions rarely say so)
        return wrap(array, meta.dtype)
    flat = apply(_permuter(order), array)
    return TpuTensor(Storage(flat), array.shape, stride, 0, meta.dtype)


def read(t: TpuTensor) -> jax.Array:
    """The value of ``t``: its storage's array, or the view cut out of it. In deferred
    mode this may be a ``deferred.Lazy`` placeholder; ``value(t)`` is always concrete."""
    st = t._tpu_storage
    if t._tpu_direct:
        return _settle(st.array)
    cache = t._tpu_cache
    if cache is not None and cache[0] == st.version:
        return _settle(cache[1])
    size = tuple(t.shape)
    stride, offset = tuple(t.stride()), t.storage_offset()
    if offset == 0 and stride == strided.contiguous_strides(size) and math.prod(size) == st.numel:
        v = apply(_reshaper(size), st.array)
    else:
        v = apply(strided.reader(st.numel, size, stride, offset), st.array)
    want = to_jax_dtype(t.dtype)
    if v.dtype != want:  # a view(dtype) of equal item size reads the storage's bits
        v = apply(_bitcaster(np.dtype(want)), v)
    t._tpu_cache = (st.version, v)
    return _settle(v)


def value(t: TpuTensor) -> jax.Array:
    """The concrete value of ``t`` (runs a pending deferred recording if needed)."""
    return force(read(t))


def _settle(v):
    """Outside deferred recording, a placeholder becomes its value."""
    return v if recording() or type(v) is not Lazy else force(v)


def write(t: TpuTensor, new: jax.Array) -> None:
    """Write ``new`` (broadcast to ``t``'s shape) into ``t``'s storage, in place."""
    st = t._tpu_storage
    size = tuple(t.shape)
    store_dtype = np.dtype(st.array.dtype)
    if np.dtype(new.dtype) != store_dtype:
        same_bits = np.dtype(new.dtype) == to_jax_dtype(t.dtype) and \
            store_dtype.itemsize == np.dtype(new.dtype).itemsize
        new = apply(_bitcaster(store_dtype) if same_bits else _caster(store_dtype), new)
    if tuple(new.shape) != size:
        new = apply(_broadcaster(size), new)
    if t._tpu_direct:
        st.array = new
    else:
        stride, offset = tuple(t.stride()), t.storage_offset()
        if offset == 0 and stride == strided.contiguous_strides(size) and math.prod(size) == st.numel:
            st.array = apply(_reshaper(tuple(st.array.shape)), new)
        else:
            st.array = apply(strided.writer(tuple(st.array.shape), size, stride, offset), st.array, new)
    st.version += 1
    t._tpu_cache = None


# Small jitted reshapes and casts, one stable function per shape or dtype, so deferred
# programs made of them are cached by identity.
@functools.lru_cache(maxsize=1024)
def _reshaper(shape: tuple[int, ...]):
    return jax.jit(lambda a: a.reshape(shape))


@functools.lru_cache(maxsize=1024)
def _permuter(order: tuple[int, ...]):
    return jax.jit(lambda a: jnp.transpose(a, order).reshape(-1))


@functools.lru_cache(maxsize=1024)
def _broadcaster(shape: tuple[int, ...]):
    return jax.jit(lambda a: jnp.broadcast_to(a, shape))


@functools.lru_cache(maxsize=64)
def _caster(dtype):
    return jax.jit(lambda a: a.astype(dtype))


@functools.lru_cache(maxsize=64)
def _bitcaster(dtype):
    return jax.jit(lambda a: jax.lax.bitcast_convert_type(a, dtype))


# -- host transfers ------------------------------------------------------------------
def to_jax(t: torch.Tensor) -> jax.Array:
    """Copy a CPU torch tensor into a new jax array on JAX's default device."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    # a private copy: .numpy() would pin the caller's storage (torch then refuses resize_)
    t = t.clone(memory_format=torch.contiguous_format)
    host = t.view(torch.int16).numpy().view(jnp.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()
    return jax.device_put(host)


def to_torch(a: jax.Array, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Copy a jax array into a new CPU torch tensor."""
    host = np.array(force(a), copy=True)
    if host.dtype == jnp.bfloat16:
        out = torch.from_numpy(host.view(np.int16)).view(torch.bfloat16)
    else:
        out = torch.from_numpy(host)
    if dtype is not None and out.dtype != dtype:
        out = out.view(dtype) if out.element_size() == torch.empty((), dtype=dtype).element_size() else out.to(dtype)
    return out


from tpu_kernels import dispatch  # noqa: E402  (dispatch needs the names above)
