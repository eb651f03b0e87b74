"""torch.distributed on the tpu device, through JAX's multi-controller runtime.

    torchrun --nproc-per-node 2 train.py        # each process:
    dist.init_process_group("tpu")              # or "cpu:gloo,tpu:tpu", or no argument
    dist.all_reduce(torch.ones(4, device="tpu"))

Each torch process is one JAX process (``jax.distributed.initialize``, fed from
torchrun's environment); each collective on tpu tensors is a small jitted program over
the mesh of the group's devices (``shard_map`` with ``psum``, ``all_gather``,
``psum_scatter``, ``all_to_all``, ``ppermute``), so DDP, FSDP2, DTensor and tensor
parallelism run unchanged, and collectives inside ``torch.compile(backend="tpu")`` graphs
are ops of the graph's one program. See docs/distributed.md.

Importing ``tpu_kernels`` only registers the backend's name (``install``); the rest loads
when a ``"tpu"`` process group is created.
"""
from __future__ import annotations

from typing import Any

BACKEND = "tpu"
_installed = False


def _create(opts: Any, backend_options: Any) -> Any:
    from tpu_kernels.distributed import backend
    _register_handlers()
    return backend.create(opts, backend_options)


def _register_handlers() -> None:
    global _installed
    if _installed:
        return
    from tpu_kernels import dispatch, graph_program
    from tpu_kernels.distributed import backend, compiled
    for op, fn in backend.handlers().items():
        dispatch.register_special(op, fn)
    graph_program.register_program_hook(compiled.program_hook)
    _installed = True


def install() -> None:
    """Register c10d backend ``"tpu"`` for tpu (and CPU) tensors. Cheap: names only."""
    import torch.distributed as dist
    if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["tpu", "cpu"])
