"""The JAX side of a torch process group: one JAX process per torch rank.

``initialize`` runs once, when the default process group gets its tpu backend: it starts
JAX's multi-controller runtime (``jax.distributed.initialize``) with this process's rank
as its process id. The coordinator listens on ``MASTER_ADDR`` at a port rank 0 picks and
publishes through the process group's store, so nothing but torchrun's environment is
needed. Each process then owns its local devices; a tpu tensor lives on the first of them,
and a collective over ranks ``r0, r1, ...`` runs over a mesh of those ranks' devices.
"""
from __future__ import annotations

import datetime
import functools
import logging
import os
import socket

import jax
import numpy as np
from jax._src import xla_bridge
from jax.sharding import Mesh

log = logging.getLogger("tpu_kernels.distributed")

AXIS = "ranks"                 # the one mesh axis every collective maps over
_KEY = "tpu_kernels/jax_coordinator"


class _World:
    size = 1                   # processes in the JAX runtime (the default group's size)
    rank = 0
    started = False            # jax.distributed.initialize ran (or was not needed)


WORLD = _World()


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _jax_started() -> bool:
    return xla_bridge.backends_are_initialized()


def initialize(store, rank: int, size: int, timeout: datetime.timedelta) -> None:
    """Start JAX's multi-controller runtime for the default group (``size`` processes).

    Must run before this process computes anything with JAX: JAX cannot join a
    distributed runtime afterwards.
    """
    if WORLD.started:
        if WORLD.size != size:
            raise RuntimeError(
                f"tpu backend: JAX's distributed runtime already runs with {WORLD.size} "
                f"processes; a new default group of {size} cannot join it (one "
                f"init_process_group per process)")
        return
    if size > 1:
        if _jax_started():
            raise RuntimeError(
                "init_process_group(backend='tpu') must run before this process uses the tpu "
                "device: JAX's runtime already started, and it can join a distributed runtime "
                "only before its first computation. Call dist.init_process_group first, then "
                "create tpu tensors and models")
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        if rank == 0:
            store.set(_KEY, f"{host}:{_free_port(host)}")
        address = store.get(_KEY).decode()
        # the CPU client's cross-process collectives (tpu_kernels on a machine with no TPU)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        heartbeat = int(os.environ.get("TPU_KERNELS_DIST_HEARTBEAT_S", "100"))
        log.info("rank %d: jax.distributed.initialize(%s, %d processes)", rank, address, size)
        jax.distributed.initialize(
            address, num_processes=size, process_id=rank,
            initialization_timeout=max(int(timeout.total_seconds()), 1),
            heartbeat_timeout_seconds=heartbeat)
    WORLD.size, WORLD.rank, WORLD.started = size, rank, True


def local_device() -> jax.Device:
    """The device this process's tpu tensors live on."""
    return jax.local_devices()[0]


@functools.lru_cache(maxsize=None)
def device_of(rank: int) -> jax.Device:
    """The device global rank ``rank``'s tpu tensors live on (its process's first)."""
    if WORLD.size == 1:
        return local_device()
    for d in jax.devices():   # ordered by process, then local id
        if d.process_index == rank:
            return d
    raise RuntimeError(f"tpu backend: JAX's runtime has no device for rank {rank} "
                       f"(it has {jax.process_count()} processes)")


@functools.lru_cache(maxsize=None)
def mesh(ranks: tuple[int, ...]) -> Mesh:
    """A one-axis mesh over the devices of ``ranks`` (global ranks, in group order)."""
    return Mesh(np.array([device_of(r) for r in ranks], dtype=object), (AXIS,))
