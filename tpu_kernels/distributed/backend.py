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

from typing import Any

from torch._C._distributed_c10d import ProcessGroupGloo

from tpu_kernels.distributed import groups, world


def create(opts: Any, backend_options: Any) -> ProcessGroupGloo:
    """c10d's extended-API creator for backend ``"tpu"`` (one per process group)."""
    if not world.WORLD.started:      # the default group comes first
        world.initialize(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    groups.created(opts.group_id, opts.timeout)
    return ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def _fsdp_op(op, args, kwargs) -> Any:
    """FSDP2's own ops (``fsdp::all_gather_copy_in`` & co.) are torch code over views and
    copies: run their CPU kernel, which calls torch ops that come back here per tensor."""
    import torch
    return op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **kwargs)


def handlers() -> dict:
    """Every op this package handles on tpu tensors -> its handler."""
    import torch
    from tpu_kernels.distributed import c10d_ops, functional
    out = dict(c10d_ops.HANDLERS)
    out.update(functional.handlers())
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  (defines fsdp::)
    import torch.distributed.fsdp._fully_shard._fsdp_param  # noqa: F401
    for name in ("all_gather_copy_in", "split_with_sizes_copy", "chunk_cat", "copy_"):
        out[getattr(torch.ops.fsdp, name).default] = _fsdp_op
    return out
