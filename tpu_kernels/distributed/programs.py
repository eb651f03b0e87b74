"""Collectives as small jitted JAX programs over a mesh of the group's devices.

Each collective is a *body*: a function of one device's block under a mapped mesh axis
(``shard_map``), written with ``lax.psum`` / ``all_gather`` / ``psum_scatter`` /
``all_to_all`` / ``ppermute``. Eager collectives run a body as its own jitted program over
a mesh of exactly the group's devices (``run``); inside a compiled graph the same body is
traced into the graph's one program, over the world's axis with ``axis_index_groups``
naming the group (see ``compiled.py``).

Every process hands in its own local array and gets its own local result: the global
arrays are declared replicated (``P()``) over the mesh, so a block is a whole local array
and no shapes change on the way in or out (``check_vma=False``: the values do differ per
device, which is the point of a collective).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from tpu_kernels.distributed import world

REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


@dataclasses.dataclass(frozen=True)
class Axis:
    """Where a body's collectives run: a mesh axis, and the groups along it (``None``: the
    whole axis is one group)."""
    name: str
    size: int                                          # devices in one group
    groups: tuple[tuple[int, ...], ...] | None = None  # axis_index_groups

    def index(self) -> jax.Array:
        """This device's position in its group (a traced int32)."""
        i = lax.axis_index(self.name)
        if self.groups is None:
            return i
        table = np.zeros(sum(len(g) for g in self.groups), np.int32)
        for g in self.groups:
            table[list(g)] = np.arange(len(g))
        return jnp.asarray(table)[i]

    @property
    def kw(self) -> dict:
        return {} if self.groups is None else {"axis_index_groups": [list(g) for g in self.groups]}


# -- bit-exact selection: broadcast and scatter add zeros to the root's bits -------------------
def _to_bits(x: jax.Array) -> jax.Array:
    if jnp.iscomplexobj(x):
        x = jnp.stack([x.real, x.imag], axis=-1)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    return lax.bitcast_convert_type(x, jnp.dtype(f"uint{x.dtype.itemsize * 8}"))


def _from_bits(b: jax.Array, like: jax.Array) -> jax.Array:
    if like.dtype == jnp.bool_:
        return b.astype(jnp.bool_)
    if jnp.iscomplexobj(like):
        part = lax.bitcast_convert_type(b, like.real.dtype)
        return lax.complex(part[..., 0], part[..., 1])
    return lax.bitcast_convert_type(b, like.dtype)


def _only_at(axis: Axis, x: jax.Array, root: int) -> jax.Array:
    """``x``'s bits on the root, zeros elsewhere: summing these over the group is exact."""
    bits = _to_bits(x)
    return jnp.where(axis.index() == root, bits, jnp.zeros_like(bits))


# -- reductions ---------------------------------------------------------------------------------
def _fold(op: str, stacked: jax.Array) -> jax.Array:
    """Reduce a gathered ``[k, ...]`` stack along its first axis."""
    if op == "product":
        return jnp.prod(stacked, axis=0, dtype=stacked.dtype)
    fn = {"band": jnp.bitwise_and, "bor": jnp.bitwise_or, "bxor": jnp.bitwise_xor,
          "min": jnp.minimum, "max": jnp.maximum, "sum": jnp.add}[op]
    return functools.reduce(fn, [stacked[i] for i in range(stacked.shape[0])])


def _mean(total: jax.Array, k: int) -> jax.Array:
    if jnp.issubdtype(total.dtype, jnp.integer):   # NCCL's integer average truncates
        return lax.div(total, jnp.asarray(k, total.dtype))
    return (total / k).astype(total.dtype)


def all_reduce(axis: Axis, x: jax.Array, op: str) -> jax.Array:
    if x.dtype == jnp.bool_:     # bools reduce as bytes: sum and max are "any", the rest "all"
        b = x.astype(jnp.uint8)
        fn = lax.pmax if op in ("sum", "max", "bor", "bxor") else lax.pmin
        if op == "bxor":
            return (lax.psum(b.astype(jnp.int32), axis.name, **axis.kw) % 2).astype(jnp.bool_)
        return fn(b, axis.name, **axis.kw).astype(jnp.bool_)
    if op in ("sum", "avg"):
        total = lax.psum(x, axis.name, **axis.kw)
        return _mean(total, axis.size) if op == "avg" else total
    if op == "max":
        return lax.pmax(x, axis.name, **axis.kw)
    if op == "min":
        return lax.pmin(x, axis.name, **axis.kw)
    return _fold(op, all_gather(axis, x))


def broadcast(axis: Axis, x: jax.Array, root: int) -> jax.Array:
    return _from_bits(lax.psum(_only_at(axis, x, root), axis.name, **axis.kw), x)


def all_gather(axis: Axis, x: jax.Array) -> jax.Array:
    """``[k, *x.shape]``: every device's block, stacked in group order."""
    return lax.all_gather(x, axis.name, axis=0, **axis.kw)


def all_gather_tiled(axis: Axis, x: jax.Array) -> jax.Array:
    """``[k * n, ...]``: every device's ``[n, ...]`` block, concatenated."""
    return lax.all_gather(x, axis.name, axis=0, tiled=True, **axis.kw)


def reduce_scatter(axis: Axis, x: jax.Array, op: str) -> jax.Array:
    """``x`` is ``[k * m, ...]``; device ``i`` gets the reduction of everyone's i-th chunk."""
    if op in ("sum", "avg") and x.dtype != jnp.bool_:
        part = lax.psum_scatter(x, axis.name, scatter_dimension=0, tiled=True, **axis.kw)
        return _mean(part, axis.size) if op == "avg" else part
    mine = all_to_all(axis, x)                     # block j: device j's chunk for me
    stacked = mine.reshape((axis.size, -1) + x.shape[1:])
    if x.dtype == jnp.bool_:
        any_ = op in ("sum", "max", "bor")
        return jnp.any(stacked, axis=0) if any_ else (
            jnp.all(stacked, axis=0) if op != "bxor" else jnp.sum(stacked, axis=0) % 2 == 1)
    return _mean(_fold("sum", stacked), axis.size) if op == "avg" else _fold(op, stacked)


def all_to_all(axis: Axis, x: jax.Array) -> jax.Array:
    """``x`` is ``[k * m, ...]``; chunk j goes to device j; block i of the result came from i."""
    return lax.all_to_all(x, axis.name, 0, 0, tiled=True, **axis.kw)


def scatter(axis: Axis, x: jax.Array, root: int) -> jax.Array:
    """The root's ``[k * m, ...]`` split in k chunks, chunk i to device i (others send zeros)."""
    part = lax.psum_scatter(_only_at(axis, x, root), axis.name, scatter_dimension=0,
                            tiled=True, **axis.kw)
    return _from_bits(part, x)


def ppermute(axis: Axis, x: jax.Array, pairs: tuple[tuple[int, int], ...]) -> jax.Array:
    return lax.ppermute(x, axis.name, perm=list(pairs))


def barrier(axis: Axis, x: jax.Array) -> jax.Array:
    return lax.psum(x, axis.name, **axis.kw)


def shard_dim_alltoall(axis: Axis, x: jax.Array, gather_dim: int, shard_dim: int) -> jax.Array:
    """DTensor's resharding: everyone's blocks concatenated along ``gather_dim``, then this
    device's chunk of that along ``shard_dim`` (``x.shape[shard_dim]`` divisible by k; the
    uneven case gives ranks different shapes: the caller gathers and cuts outside)."""
    return lax.all_to_all(x, axis.name, shard_dim, gather_dim, tiled=True, **axis.kw)


BODIES: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (all_reduce, broadcast, all_gather, all_gather_tiled, reduce_scatter,
                            all_to_all, scatter, ppermute, barrier, shard_dim_alltoall)}


# -- eager: one jitted program per (collective, parameters, group) -----------------------------
def _framed(body: Callable, concat: bool, shape: tuple | None, unstack: bool) -> Callable:
    """``body`` with the reshapes around it that c10d's tensor layouts need, in-program:
    ``concat`` flattens and concatenates the inputs first (a list of chunks), ``shape``
    reshapes the result (flat c10d buffers), ``unstack`` splits a stacked result in a tuple."""
    def framed(*xs):
        x = jnp.concatenate([a.reshape(-1) for a in xs]) if concat else xs[0]
        out = body(x)
        if shape is not None:
            out = out.reshape(shape)
        return tuple(out[i] for i in range(out.shape[0])) if unstack else out
    return framed


@functools.lru_cache(maxsize=4096)
def _program(kind: str, params: tuple, ranks: tuple[int, ...], concat: bool,
             shape: tuple | None, unstack: bool) -> Callable:
    axis = Axis(world.AXIS, len(ranks))
    body = _framed(functools.partial(BODIES[kind], axis, **dict(params)), concat, shape, unstack)
    return jax.jit(jax.shard_map(body, mesh=world.mesh(ranks), in_specs=P(), out_specs=P(),
                                 check_vma=False))


@functools.lru_cache(maxsize=None)
def _replicated(ranks: tuple[int, ...]) -> NamedSharding:
    return NamedSharding(world.mesh(ranks), P())


def globalize(a: jax.Array, ranks: tuple[int, ...]) -> jax.Array:
    """This process's local array as its block of a global array over ``ranks``' mesh."""
    if not isinstance(a, jax.Array) or a.devices() != {world.local_device()}:
        a = jax.device_put(a, world.local_device())
    return jax.make_array_from_single_device_arrays(a.shape, _replicated(ranks), [a])


def local(a: jax.Array) -> jax.Array:
    """This process's block of a global result."""
    return a.addressable_data(0)


def run(kind: str, ranks: tuple[int, ...], *arrays: jax.Array, concat: bool = False,
        shape: tuple | None = None, unstack: bool = False, **params: Any) -> Any:
    """Run collective ``kind`` over the group ``ranks`` (global ranks, in group order) on
    this process's ``arrays``; returns this process's result (dispatched, not waited for).
    ``concat``, ``shape`` and ``unstack`` frame the body (see ``_framed``)."""
    program = _program(kind, tuple(sorted(params.items())), ranks, concat, shape, unstack)
    return jax.tree.map(local, program(*(globalize(a, ranks) for a in arrays)))
