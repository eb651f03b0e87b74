"""The ``tpu`` c10d backend: what ``dist.init_process_group("tpu")`` creates.

torch's Python-registered backends must be C++ ``Backend`` objects, and c10d routes an op
to the backend of its tensors' device *below* the tensor's Python dispatch. Collectives on
tpu tensors never get that far: their ``c10d::*`` and ``_c10d_functional::*`` ops reach the
tpu tensor's ``__torch_dispatch__`` first, where the handlers of ``c10d_ops`` and
``functional`` run them as JAX collectives. So the object this creator hands to c10d is a
gloo backend over the same store: it serves CPU tensors of a ``"tpu"`` group (object
collectives, CPU metadata), and anything that would reach it with a tpu tensor fails
loudly instead of silently doing nothing. Creating the default group also starts JAX's
multi-controller runtime (``world.initialize``).
"""
from __future__ import annotations

import functools
import importlib
from typing import Any

import torch
from torch._C._distributed_c10d import ProcessGroupGloo

from tpu_kernels import dispatch
from tpu_kernels.distributed import c10d_ops, fsdp, functional, groups, world


@functools.cache
def _first_group() -> None:
    """What only FSDP2 and DTensor need, set up with the first "tpu" process group (which
    both need) rather than at ``import tpu_kernels``: importing torch.distributed.fsdp and
    torch.distributed.tensor takes about 1 s, half of the package's import. FSDP2's
    storage helpers are wrapped and its ``fsdp::`` ops handled; importing dtensor_ops
    registers DTensor's sharding rules for tpu's attention op."""
    for op, fn in fsdp.install().items():
        dispatch.register_runtime(op, fn)
    importlib.import_module("tpu_kernels.distributed.dtensor_ops")


def create(opts: Any, backend_options: Any) -> ProcessGroupGloo:
    """c10d's extended-API creator for backend ``"tpu"`` (one per process group)."""
    _first_group()
    if not world.WORLD.started:      # the default group comes first
        world.initialize(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    groups.created(opts.group_id, opts.timeout)
    return ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def handlers() -> dict:
    """Every op this package handles on tpu tensors -> its handler."""
    out = dict(c10d_ops.HANDLERS)
    out.update(functional.handlers())
    # torch.distributed.checkpoint records whether each saved tensor is pinned host memory
    out[torch.ops.aten.is_pinned.default] = lambda op, args, kwargs: False
    return out
