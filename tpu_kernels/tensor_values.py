"""A tpu tensor's value: read from its storage (a view cut out, cached per storage
version), written back in place, and its (storage, geometry) source for compiled programs.
Functions of ``tensor.TpuTensor`` instances; this module does not import it."""
from __future__ import annotations

from typing import TYPE_CHECKING

import jax

from tpu_kernels import shadow
from tpu_kernels.lazy import Lazy, concrete, recording
from tpu_kernels.storage import Storage, read_view, write_through, write_view, write_views

if TYPE_CHECKING:
    from tpu_kernels.tensor import TpuTensor


def source(t: TpuTensor) -> tuple[Storage, tuple]:
    """(storage, (sizes, strides, offset, dtype)) of a tpu tensor that has a storage: its
    shadow's if it has one, else read off the tensor once and kept on it (``_tpu_geom``;
    no shadow made: a compiled graph's fresh inputs, the saved activations and gradients a
    backward gets, an eager fused optimizer step's moments need none). ``tensor.repoint``,
    where a tensor's geometry changes, drops both."""
    d = t.__dict__
    s = d.get("_tpu_shadow")
    if s is not None:
        return s._tpu_source
    g = d.get("_tpu_geom")
    if g is None:
        g = d["_tpu_geom"] = shadow.geometry(t)
    return t._tpu_storage, g


def read(t: TpuTensor) -> jax.Array:
    """The value of ``t``: its storage's array, or the view cut out of it. While deferred
    mode records this may be a ``lazy.Lazy`` placeholder; ``value(t)`` is always concrete."""
    st = t._tpu_storage
    if t._tpu_direct:
        return _settle(st.array)
    cache = t._tpu_cache
    if cache is not None and cache[0] == st.version:
        return _settle(cache[1])
    v = read_view(st, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)
    t._tpu_cache = (st.version, v)
    return _settle(v)


def storage_value(t: TpuTensor) -> jax.Array:
    """The whole array of ``t``'s storage (``read`` for the storage, not the view)."""
    return _settle(t._tpu_storage.array)


def value(t: TpuTensor) -> jax.Array:
    """The concrete value of ``t`` (runs a pending deferred recording if needed)."""
    if t._tpu_direct:   # ``read``'s common case without its calls (every sync makes one)
        v = t._tpu_storage.array
        return v if type(v) is not Lazy else concrete(v)
    return concrete(read(t))


def _settle(v):
    """Outside deferred recording, a placeholder becomes its value."""
    return v if type(v) is not Lazy or recording() else concrete(v)


def write(t: TpuTensor, new: jax.Array) -> None:
    """Write ``new`` (broadcast to ``t``'s shape) into ``t``'s storage, in place."""
    st = t._tpu_storage
    if t._tpu_direct and st.placement is None:
        old = st.array   # the common case (an in-place op's result): the new array as it is
        if new.dtype == old.dtype and new.shape == old.shape:
            st.array = new
            st.version += 1
            t._tpu_cache = None
            if st.links is not None:
                write_through(st)
            return
    write_view(st, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype, t._tpu_direct, new)
    t._tpu_cache = None


def write_all(pairs: list[tuple[TpuTensor, jax.Array]]) -> None:
    """``write(t, new)`` for each pair, in order; views of one storage that take a value of
    their own size and the storage's dtype are written together (one program, one new
    array of the storage: a foreach op over flat parameters' or bucketed gradients' views
    wrote the whole storage once per view)."""
    if all(t._tpu_direct for t, _ in pairs):   # (a fused optimizer's parameters and moments)
        for t, new in pairs:                    # no view to group
            write(t, new)
        return
    groups: dict[int, list | None] = {}
    for t, new in pairs:
        st = t._tpu_storage
        fits = (not t._tpu_direct and st.placement is None and st.links is None
                and new.dtype == st.array.dtype and tuple(new.shape) == tuple(t.shape))
        group = groups.setdefault(id(st), [])
        if group is not None and fits:
            group.append((t, new))
        else:      # a storage any other write touches keeps the writes' order
            groups[id(st)] = None
    for t, new in pairs:
        group = groups[id(t._tpu_storage)]
        if group is None or len(group) == 1:
            write(t, new)
        elif group:     # the storage's first view: all of its views, now
            views = [(tuple(v.shape), tuple(v.stride()), v.storage_offset()) for v, _ in group]
            write_views(t._tpu_storage, views, [n for _, n in group])
            for v, _ in group:
                v._tpu_cache = None
            group.clear()     # (its later views are written)
