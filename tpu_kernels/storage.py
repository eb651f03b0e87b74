"""Storage: the jax arrays under tpu tensors, read and written through strided views.

Like torch, a tpu tensor is (storage, sizes, strides, storage offset). A ``Storage`` is a
mutable box for one jax array that the views of one base share; an in-place op writes a
new array into it and bumps its version. ``read_view`` and ``write_view`` cut a view out
of a storage and write one back, with the jitted programs of ``strided.py`` (recorded
into a deferred program when one is being recorded). ``to_jax``/``to_torch`` copy
between host torch tensors and jax arrays.
"""
from __future__ import annotations

import functools
import math
import sys
import threading
import weakref
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tpu_kernels import devices, memory, strided
from tpu_kernels.lazy import apply, concrete
from tpu_kernels.registry.dtypes import BITS, to_jax_dtype, to_torch_dtype


class Storage:
    """A mutable box for one jax array; views of one base share it. ``index``: the tpu
    device holding it; ``nbytes``: what it counts in ``torch.tpu.memory_allocated``."""
    __slots__ = ("array", "version", "shadow", "index", "nbytes", "placement", "links", "__weakref__")

    def __init__(self, array: jax.Array, index: int | None = None, nbytes: int | None = None) -> None:
        self.array = array
        self.version = 0
        self.shadow = None   # a memory-less torch storage standing for it under torch.compile
        self.index = devices.index_of_array(array) if index is None else index
        # ``nbytes`` known (the dispatcher's hot path): a jax array's own is a Python property
        # that canonicalizes its dtype (about 3 us an array); a plain dtype's item size is cheap
        if nbytes is None and type(array.dtype) is np.dtype:
            nbytes = math.prod(array.shape) * array.dtype.itemsize
        self.nbytes = memory.allocate(self.index, array, nbytes)
        self.placement = None   # a sharding every write keeps (``place``), else None
        self.links = None       # storages kept equal to a view of this one (``link``)

    def __del__(self, _finalizing=sys.is_finalizing) -> None:
        if hasattr(self, "nbytes"):   # a storage whose __init__ did not finish counted nothing
            try:
                memory.free(self.index, self.nbytes)
            except (TypeError, AttributeError):
                if not _finalizing():    # (at interpreter exit the modules' globals are gone)
                    raise

    def __reduce__(self):
        """Pickled as a host copy and its location ("tpu:0"); ``rebuild_storage`` restores it."""
        return (rebuild_storage, (to_torch(concrete(self.array)), f"tpu:{self.index}"))

    @property
    def numel(self) -> int:
        return self.array.size


def read_view(st: Storage, size: tuple[int, ...], stride: tuple[int, ...], offset: int,
              dtype: torch.dtype) -> jax.Array:
    """The value of the view (``size``, ``stride``, ``offset``, ``dtype``) of ``st``."""
    if offset == 0 and stride == strided.contiguous_strides(size) and math.prod(size) == st.numel:
        v = apply(_reshaper(size), st.array)
    else:
        v = apply(strided.reader(st.numel, size, stride, offset), st.array)
    want = to_jax_dtype(dtype)
    if v.dtype != want:  # a view(dtype) of equal item size reads the storage's bits
        v = apply(_bitcaster(np.dtype(want)), v)
    return v


@functools.lru_cache(maxsize=4096)
def view_reader(shape: tuple[int, ...], size: tuple[int, ...], stride: tuple[int, ...], offset: int,
                have: np.dtype, want: np.dtype):
    """The function ``storage array -> value`` of the view (``size``, ``stride``,
    ``offset``, dtype ``want``) of a storage of ``shape`` and dtype ``have``, for an op's
    program to apply to the storage itself (the read folded into the op's executable);
    None for a view that is a gather (overlapping strides: read on its own)."""
    numel = math.prod(shape)
    if offset == 0 and stride == strided.contiguous_strides(size) and math.prod(size) == numel:
        read = _reshaper(size)
    elif strided.plan(numel, size, stride, offset).kind == "gather":
        return None
    else:
        read = strided.reader(numel, size, stride, offset)
    if want == have:
        return read
    cast = _bitcaster(want)
    return lambda a: cast(read(a))


def write_view(st: Storage, size: tuple[int, ...], stride: tuple[int, ...], offset: int,
               dtype: torch.dtype, whole: bool, new: jax.Array) -> None:
    """Write ``new`` (broadcast to ``size``) into the view of ``st``, in place; ``whole``:
    the view is the storage's whole array in its own shape."""
    store_dtype = np.dtype(st.array.dtype)
    if np.dtype(new.dtype) != store_dtype:
        same_bits = np.dtype(new.dtype) == to_jax_dtype(dtype) and \
            store_dtype.itemsize == np.dtype(new.dtype).itemsize
        new = apply(_bitcaster(store_dtype) if same_bits else _caster(store_dtype), new)
    if tuple(new.shape) != size:
        new = apply(_broadcaster(size), new)
    if whole:
        st.array = new
    elif offset == 0 and stride == strided.contiguous_strides(size) and math.prod(size) == st.numel:
        st.array = apply(_reshaper(tuple(st.array.shape)), new)
    else:
        st.array = apply(strided.writer(tuple(st.array.shape), size, stride, offset), st.array, new)
    if st.placement is not None:   # a sharded storage stays laid out as it was placed
        st.array = apply(_placer(st.placement), st.array)
    st.version += 1
    if st.links is not None:
        write_through(st)


def write_views(st: Storage, views: list[tuple], values: list[jax.Array]) -> None:
    """Write each of ``values`` into its view of ``st`` ((size, stride, offset) each; the
    value of that size and of the storage's dtype), in order, with one program: what
    ``write_view`` does one view at a time, each making a new array of the whole storage."""
    st.array = apply(strided.writes(tuple(st.array.shape), tuple(views)), st.array, *values)
    st.version += 1


# -- linked copies: views whose item size differs from their base's ---------------------------
# A storage holds one array of one dtype, so a complex tensor's view_as_real (and a real
# tensor's view_as_complex, the lazy conj/neg views) is a copy in a storage of its own. A
# link keeps the two equal as torch's aliasing would: a write to either rewrites the other.
_THROUGH = threading.local()


def link(base: Storage, view: tuple, copy: Storage, forward: Callable, inverse: Callable) -> None:
    """Keep ``copy`` (whole, ``forward`` of the view ``view`` = (size, stride, offset,
    dtype, whole) of ``base``) and that view equal: a write to one rewrites the other
    (``inverse`` maps the copy back). Links are weak: a dead copy is dropped."""
    def refresh(src: Storage, dst: Storage) -> None:
        dst.array = apply(forward, read_view(src, *view[:4]))
        dst.version += 1
        if dst.links is not None:
            write_through(dst)

    def write_back(src: Storage, dst: Storage) -> None:
        write_view(dst, *view, apply(inverse, src.array))
    base.links = [*(base.links or ()), (weakref.ref(copy), refresh)]
    copy.links = [*(copy.links or ()), (weakref.ref(base), write_back)]


def write_through(st: Storage) -> None:
    """``st`` was written: rewrite the storages linked to it (not the one whose write this
    is, which is being written through already)."""
    busy = getattr(_THROUGH, "busy", None)
    if busy is None:
        busy = _THROUGH.busy = set()
    busy.add(id(st))
    try:
        live = []
        for ref, update in st.links:
            other = ref()
            if other is not None:
                live.append((ref, update))
                if id(other) not in busy:
                    update(st, other)
        st.links = live or None
    finally:
        busy.discard(id(st))


def copied(st: Storage) -> Storage:
    """A new storage holding a device copy of ``st``'s array (its placement kept): what
    ``copy.deepcopy`` gives every view of ``st`` (a copy, not the array itself: a compiled
    program may donate one storage's array, which must not free the other's)."""
    new = Storage(apply(_copier, st.array), st.index, st.nbytes)
    new.placement = st.placement
    return new


_copier = jax.jit(jnp.copy)


def place(st: Storage, sharding: jax.sharding.Sharding) -> None:
    """Lay ``st``'s array out by ``sharding`` (e.g. over a device mesh); later writes keep it."""
    a = concrete(st.array)
    if isinstance(a, jax.ShapeDtypeStruct):    # an abstract array (``tpu_kernels.aot``)
        st.array = jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
    else:
        st.array = jax.device_put(a, sharding)
    st.placement = sharding
    st.version += 1


def to_dense(array: jax.Array, order: tuple[int, ...]) -> jax.Array:
    """``array`` laid out in memory order ``order`` (outermost dim first): its dims
    transposed, not flattened (a sharded dim stays sharded)."""
    return apply(_permuter(order), array)


# Small jitted reshapes and casts, one stable function per shape or dtype, so deferred
# programs made of them are cached by identity.
@functools.lru_cache(maxsize=1024)
def _reshaper(shape: tuple[int, ...]):
    return jax.jit(lambda a: a.reshape(shape))


@functools.lru_cache(maxsize=1024)
def _permuter(order: tuple[int, ...]):
    return jax.jit(lambda a: jnp.transpose(a, order))


@functools.lru_cache(maxsize=1024)
def _broadcaster(shape: tuple[int, ...]):
    return jax.jit(lambda a: jnp.broadcast_to(a, shape))


@functools.lru_cache(maxsize=64)
def _placer(sharding):
    return jax.jit(lambda a: jax.lax.with_sharding_constraint(a, sharding))


@functools.lru_cache(maxsize=64)
def _caster(dtype):
    return jax.jit(lambda a: a.astype(dtype))


@functools.lru_cache(maxsize=64)
def _bitcaster(dtype):
    return jax.jit(functools.partial(_bitcast, dtype=np.dtype(dtype)))


def _bitcast(a: jax.Array, dtype: np.dtype) -> jax.Array:
    """``a``'s bits read as ``dtype`` (same item size). XLA bit-casts no bools: a byte read
    as bool is true where nonzero, a bool read as a byte is 0 or 1."""
    if dtype == np.bool_:
        return a != 0
    if a.dtype == np.bool_:
        return a.astype(dtype)
    return jax.lax.bitcast_convert_type(a, dtype)


def _clear_program_caches() -> None:
    for f in (_reshaper, _permuter, _broadcaster, _caster, _bitcaster, strided.reader, strided.writer,
              strided.writes, view_reader):
        f.cache_clear()


memory.on_empty_cache(_clear_program_caches)


# -- checkpoints (torch.save / torch.load) --------------------------------------------
LOAD = threading.local()   # ``map_location`` of a torch.load that serialization.py runs itself


def restore_target(location: str, host: torch.Tensor) -> str:
    """Where a storage saved at ``location`` goes, by the running torch.load's map_location."""
    m = getattr(LOAD, "map_location", None)
    if m is None:
        m = torch.serialization._serialization_tls.map_location
    if m is None:
        return location
    if isinstance(m, dict):
        return str(m.get(location, location))
    if isinstance(m, (str, torch.device)):
        return str(m)
    moved = m(host.untyped_storage(), location)   # a callable: torch's contract
    return location if moved is None else str(moved.device)


def rebuild_storage(host: torch.Tensor, location: str) -> Storage | torch.Tensor:
    """A saved storage, back on the device its map_location names (a CPU tensor for "cpu")."""
    target = torch.device(restore_target(location, host))
    if target.type == "cpu":
        return host
    if target.type != "tpu":
        return host.to(target)
    i = devices.index(target)
    return Storage(to_jax(host, i), i)


# -- host transfers ------------------------------------------------------------------
def to_jax(t: torch.Tensor, index: int | None = None) -> jax.Array:
    """Copy a CPU torch tensor into a new jax array on tpu ``index`` (default: the current
    device)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    # a private copy: .numpy() would pin the caller's storage (torch then refuses resize_)
    t = t.clone(memory_format=torch.contiguous_format)
    bits = BITS.get(t.dtype)
    host = t.view(bits).numpy().view(to_jax_dtype(t.dtype)) if bits is not None else t.numpy()
    i = devices.current_device() if index is None else index
    # tpu:0 arrays stay uncommitted (JAX's default device), as they always were
    return jax.device_put(host) if i == 0 else jax.device_put(host, devices.jax_device(i))


def to_torch(a: jax.Array, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Copy a jax array into a new CPU torch tensor."""
    host = np.array(concrete(a), copy=True)
    kind = to_torch_dtype(host.dtype)
    bits = BITS.get(kind)
    out = torch.from_numpy(host) if bits is None else torch.from_numpy(host.view(to_jax_dtype(bits))).view(kind)
    if dtype is not None and out.dtype != dtype:
        out = out.view(dtype) if out.element_size() == torch.empty((), dtype=dtype).element_size() else out.to(dtype)
    return out
