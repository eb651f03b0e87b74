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

Importing ``tpu_kernels`` registers the backend and the handlers (``install``); JAX's
distributed runtime starts when the default ``"tpu"`` process group is created.
"""
from __future__ import annotations

import torch.distributed as dist

from tpu_kernels import dispatch
from tpu_kernels.dispatch.graph_trace import register_program_hook
from tpu_kernels.distributed import backend, compiled

BACKEND = "tpu"


def install() -> None:
    """Register c10d backend ``"tpu"`` for tpu (and CPU) tensors, the handlers of the c10d
    and functional collectives on tpu tensors, and the compiled graphs' SPMD program hook."""
    if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
        return
    for op, fn in backend.handlers().items():
        dispatch.register_runtime(op, fn)
    register_program_hook(compiled.program_hook)
    dist.Backend.register_backend(BACKEND, backend.create, extended_api=True, devices=["tpu", "cpu"])
