"""Reading and writing a strided view of a flat storage with jax ops.

A tpu tensor is (storage, sizes, strides, offset) exactly as in torch; its value is
read from the storage's flat array. Most views (transposes, slices with steps,
``select``, ``diagonal``, ``expand``) are a reshape of a window of the storage
followed by basic slicing and a transpose, which XLA does without a gather; the rest
(overlapping strides) fall back to a gather with precomputed indices. Where the window is
a box of the storage cut on the view's stride grid (a transpose, a slice of a dim), it is
cut from the storage reshaped to that grid, never flattened: a sharded storage keeps its
sharding (a flattened one is gathered whole onto every device of an SPMD program).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np


@functools.lru_cache(maxsize=4096)
def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def memory_order(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dims from outermost to innermost in memory, if ``stride`` lays ``shape`` out
    densely (a permutation of contiguous strides); None otherwise."""
    if 0 in shape:
        return None
    order = tuple(sorted(range(len(shape)), key=lambda d: (-stride[d], -shape[d])))
    acc = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != acc:
            return None
        acc *= shape[d]
    return order


@dataclasses.dataclass(frozen=True)
class Plan:
    """How to cut a view out of a flat storage of ``numel`` elements."""
    size: tuple[int, ...]
    kind: str                          # "empty" | "window" | "gather"
    offset: int = 0
    span: int = 0                      # elements of the storage window
    base_shape: tuple[int, ...] = ()   # window reshaped to this
    index: tuple = ()                  # basic index into base_shape
    perm: tuple[int, ...] = ()         # transpose back to the view's dim order
    squeezed: tuple[int, ...] = ()     # shape after dropping size-1 and expanded dims
    gather_idx: np.ndarray | None = dataclasses.field(default=None, compare=False)


@functools.lru_cache(maxsize=4096)
def plan(numel: int, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> Plan:
    if math.prod(size) == 0:
        return Plan(size, "empty")
    dims = [(n, s, i) for i, (n, s) in enumerate(zip(size, stride)) if n > 1 and s != 0]
    dims.sort(key=lambda d: -d[1])
    strides = [s for _, s, _ in dims]
    sizes = [n for n, _, _ in dims]
    ok = all(s > 0 for s in strides) and all(
        strides[i] % strides[i + 1] == 0 and strides[i] >= sizes[i + 1] * strides[i + 1]
        for i in range(len(dims) - 1))
    squeezed = tuple(n for n, _, _ in sorted(dims, key=lambda d: d[2]))
    if not ok:
        idx = np.full(size, offset, dtype=np.int64)
        for d, (n, s) in enumerate(zip(size, stride)):
            shape = [1] * len(size)
            shape[d] = n
            idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
        return Plan(size, "gather", gather_idx=idx.reshape(-1))
    if not dims:
        return Plan(size, "window", offset, 1, (1,), (0,), (), ())
    base = [sizes[0]] + [strides[i - 1] // strides[i] for i in range(1, len(dims))] + [strides[-1]]
    index = (slice(None),) + tuple(slice(0, n) for n in sizes[1:]) + (0,)
    order = [i for _, _, i in dims]               # original position of each sorted dim
    rank = {p: j for j, p in enumerate(sorted(order))}
    sorted_ranks = [rank[p] for p in order]        # sorted dim j -> position among kept dims
    perm = tuple(int(j) for j in np.argsort(sorted_ranks))
    return Plan(size, "window", offset, sizes[0] * strides[0], tuple(base), index, perm, squeezed)


def _window(flat: jax.Array, p: Plan) -> jax.Array:
    end = min(flat.shape[0], p.offset + p.span)
    seg = flat[p.offset:end]
    if end - p.offset < p.span:  # the tail past the storage is never selected
        seg = jnp.pad(seg, (0, p.span - (end - p.offset)))
    return seg.reshape(p.base_shape)


def _box(numel: int, p: Plan) -> tuple[tuple[int, ...], tuple] | None:
    """The storage's shape on the view's stride grid and the view's window as a basic
    index into it, or None when the window wraps around a grid row (cut it flat)."""
    if len(p.base_shape) < 2 or numel % (row := p.span // p.base_shape[0]):   # outermost stride
        return None
    grid = (numel // row,) + p.base_shape[1:]
    digits = [int(d) for d in np.unravel_index(p.offset, grid)]   # where the window starts
    index = (slice(digits[0], digits[0] + p.base_shape[0]),) + tuple(
        slice(d + i.start, d + i.stop) for d, i in zip(digits[1:-1], p.index[1:-1])) + (digits[-1],)
    if any(i.stop > n for i, n in zip(index[:-1], grid)):
        return None
    return grid, index


def _expand_to(x: jax.Array, p: Plan, stride: tuple[int, ...]) -> jax.Array:
    kept = tuple(n if (n > 1 and s != 0) else 1 for n, s in zip(p.size, stride))
    return jnp.broadcast_to(x.reshape(kept), p.size)


@functools.lru_cache(maxsize=4096)
def reader(numel: int, size: tuple[int, ...], stride: tuple[int, ...], offset: int):
    """A jitted ``storage -> view value`` for this geometry (any storage shape of
    ``numel`` elements)."""
    p = plan(numel, size, stride, offset)
    box = _box(numel, p) if p.kind == "window" else None

    def read(storage: jax.Array) -> jax.Array:
        flat = storage.reshape(-1)
        if p.kind == "empty":
            return jnp.zeros(size, storage.dtype)
        if p.kind == "gather":
            return flat[p.gather_idx].reshape(size)
        x = storage.reshape(box[0])[box[1]] if box else _window(flat, p)[p.index]
        return _expand_to(jnp.transpose(x, p.perm) if p.perm else x, p, stride)

    return jax.jit(read)


@functools.lru_cache(maxsize=4096)
def writer(shape: tuple[int, ...], size: tuple[int, ...], stride: tuple[int, ...], offset: int):
    """A jitted ``(storage, value) -> new storage`` writing ``value`` into the view."""
    return jax.jit(_write(shape, size, stride, offset))


@functools.lru_cache(maxsize=1024)
def writes(shape: tuple[int, ...], views: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...]):
    """A jitted ``(storage, *values) -> new storage`` writing each value into its view
    (``views``: (size, stride, offset) each), in order: one program and one new array
    where ``writer`` would make one per view (a foreach op's results written into views of
    one storage: flat parameters, gradients in buckets)."""
    steps = [_write(shape, *v) for v in views]

    def write_all(storage: jax.Array, *values: jax.Array) -> jax.Array:
        for step, value in zip(steps, values):
            storage = step(storage, value)
        return storage

    return jax.jit(write_all)


def _write(shape: tuple[int, ...], size: tuple[int, ...], stride: tuple[int, ...], offset: int):
    """``(storage, value) -> new storage`` writing ``value`` into the view (unjitted)."""
    numel = math.prod(shape)
    p = plan(numel, size, stride, offset)
    box = _box(numel, p) if p.kind == "window" else None

    def write(storage: jax.Array, value: jax.Array) -> jax.Array:
        flat = storage.reshape(-1)
        value = jnp.broadcast_to(value.astype(storage.dtype), size)
        if p.kind == "empty":
            return storage
        if p.kind == "gather":
            return flat.at[p.gather_idx].set(value.reshape(-1)).reshape(shape)
        # expanded (stride-0) dims hold one element: write its first copy
        value = value[tuple(0 if (n > 1 and s == 0) else slice(None) for n, s in zip(size, stride))]
        v = value.reshape(p.squeezed) if p.squeezed else value.reshape(())
        if p.perm:
            v = jnp.transpose(v, np.argsort(p.perm))
        if box:
            return storage.reshape(box[0]).at[box[1]].set(v).reshape(shape)
        win = _window(flat, p).at[p.index].set(v).reshape(-1)
        end = min(flat.shape[0], p.offset + p.span)
        flat = jax.lax.dynamic_update_slice(flat, win[: end - p.offset], (p.offset,))
        return flat.reshape(shape)

    return write
