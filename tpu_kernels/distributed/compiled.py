"""Collectives inside ``torch.compile(backend="tpu")`` graphs: one SPMD program per graph.

A compiled graph runs as one ``jax.jit`` (``graph_program.GraphProgram``). When its graph
holds collectives (Dynamo turns ``dist.all_reduce`` into ``_c10d_functional`` ops; DTensor
emits them directly), the program is built over the mesh of every rank's device instead:
each process's inputs are its blocks of global arrays (``programs.globalize``), the graph
is traced inside ``shard_map``, and each functional collective traces its body with
``lax.psum`` & co. over the mesh axis, so the collectives are ops inside the one program
XLA compiles. A sub-group collective names its group through ``axis_index_groups``, which
needs every group of the partition: groups must tile the ranks as DeviceMesh dimensions
do (equal strided blocks); others raise.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

import jax
import torch
from jax.sharding import PartitionSpec as P

from tpu_kernels.distributed import programs, world
from tpu_kernels.distributed.groups import Group
from tpu_kernels.distributed.programs import Axis

_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "_dtensor", "c10d")
_state = threading.local()     # .world: the ranks of the program being traced, or None


def has_collectives(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target.namespace in _NAMESPACES for n in gm.graph.nodes)


@contextlib.contextmanager
def _tracing(ranks: tuple[int, ...]) -> Iterator[None]:
    old, _state.world = getattr(_state, "world", None), ranks
    try:
        yield
    finally:
        _state.world = old


def partition(ranks: tuple[int, ...], size: int) -> tuple[tuple[int, ...], ...] | None:
    """All groups shaped like ``ranks`` (a strided block: ``s, s+d, ..., s+(k-1)d``) that tile
    ``range(size)``, as DeviceMesh's dimension groups do; ``None`` if ``ranks`` is not one."""
    k = len(ranks)
    if k == 1:
        return tuple((r,) for r in range(size))
    d = ranks[1] - ranks[0]
    block = d * k
    if d <= 0 or any(b - a != d for a, b in zip(ranks, ranks[1:])) or size % block \
            or ranks[0] % block >= d:
        return None
    return tuple(tuple(b * block + o + i * d for i in range(k))
                 for b in range(size // block) for o in range(d))


def axis_for(group: Group, name: str) -> Axis:
    ranks = getattr(_state, "world", None)
    if ranks is None:
        raise RuntimeError(
            f"tpu {name}: a collective on traced values outside a distributed tpu program. "
            f"Collectives trace only inside torch.compile(backend='tpu') graphs")
    if group.ranks == ranks:
        return Axis(world.AXIS, len(ranks))
    groups = partition(group.ranks, len(ranks))
    if groups is None:
        raise NotImplementedError(
            f"tpu {name} over ranks {list(group.ranks)} inside a compiled graph: a compiled "
            f"tpu program needs the group to be a DeviceMesh dimension (equal strided blocks "
            f"that tile all {len(ranks)} ranks); run it eagerly or build the groups with "
            f"init_device_mesh")
    return Axis(world.AXIS, group.size, groups)


def in_program(name: str, group: Group, kind: str, xs: list, params: dict, **frame: Any) -> Any:
    """Trace collective ``kind`` on traced values ``xs`` into the enclosing program."""
    body = functools.partial(programs.BODIES[kind], axis_for(group, name), **params)
    return programs._framed(body, frame.get("concat", False), frame.get("shape"),
                            frame.get("unstack", False))(*xs)


class SpmdProgram:
    """``trace(statics, key, *arrays)`` as one program over every rank's device."""

    def __init__(self, trace: Callable) -> None:
        self._trace = trace
        self._ranks = tuple(range(world.WORLD.size))
        self._jitted = jax.jit(self._mapped, static_argnums=0)

    def _mapped(self, statics: Any, *arrays: jax.Array) -> Any:
        def body(*blocks):
            with _tracing(self._ranks):
                return self._trace(statics, *blocks)
        return jax.shard_map(body, mesh=world.mesh(self._ranks), in_specs=P(), out_specs=P(),
                             check_vma=False)(*arrays)

    def __call__(self, statics: Any, *arrays: jax.Array) -> Any:
        out = self._jitted(statics, *(programs.globalize(a, self._ranks) for a in arrays))
        return jax.tree.map(programs.local, out)


def program_hook(gm: torch.fx.GraphModule, trace: Callable) -> Callable | None:
    """``graph_program``'s hook: graphs with collectives get an ``SpmdProgram``."""
    return SpmdProgram(trace) if has_collectives(gm) else None
