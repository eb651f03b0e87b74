"""``nn.DataParallel`` on the tpu device: with one device the module runs there on the
inputs moved to it, as CUDA's DataParallel does with one GPU; over several tpu devices it
is refused, naming what to use.

torch's DataParallel splits its inputs with ``torch._C._scatter``, which only a CUDA build
of torch has, so a tpu model wrapped the way CUDA code wraps it (``nn.DataParallel(model)``)
failed at its first call with an AttributeError.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import torch
from torch.utils._pytree import tree_map


def _scatter(self: torch.nn.DataParallel, scatter: Any, inputs: tuple, kwargs: dict | None,
             device_ids: Sequence[Any]) -> Any:
    if self.src_device_obj.type != "tpu":
        return scatter(self, inputs, kwargs, device_ids)
    if len(device_ids) != 1:
        raise NotImplementedError(
            f"nn.DataParallel over {len(device_ids)} tpu devices: it replicates the module into one "
            "Python thread per device, which tpu devices do not support. Use DistributedDataParallel "
            "(torchrun, init_process_group('tpu')) or tpu_kernels.spmd, or DataParallel(model, "
            "device_ids=[0]) for one device.")
    device = self.src_device_obj
    move = functools.partial(_to, device)   # differentiable, as CUDA's scatter is
    return (tree_map(move, tuple(inputs)),), (tree_map(move, dict(kwargs or {})),)


def _to(device: torch.device, x: Any) -> Any:
    return x.to(device) if isinstance(x, torch.Tensor) else x


@functools.cache   # once per process
def install() -> None:
    """``nn.DataParallel.scatter`` knows the tpu device."""
    cls = torch.nn.DataParallel
    cls.scatter = functools.partialmethod(_scatter, cls.scatter)
