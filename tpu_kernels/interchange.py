"""DLPack export of tpu tensors: refused with a clear error.

DLPack names no TPU device type, and a tpu tensor's memory is a JAX array, not memory
torch's C++ exporter can describe: ``torch.utils.dlpack.to_dlpack(t)`` made a capsule
whose tensor was broken (any use raised ``AttributeError``), and ``np.from_dlpack(t)`` /
``torch.from_dlpack(t)`` failed deep inside torch. Each now raises at once, saying what
works: ``t.cpu()`` for a host tensor, ``t.jax()`` for the JAX array (which has DLPack
support of its own on CPU and GPU backends).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.utils.dlpack

from tpu_kernels.tensor import TpuTensor


def _refusal(t: torch.Tensor) -> RuntimeError:
    return RuntimeError(
        f"tpu tensors cannot be exported through DLPack (tensor of shape {tuple(t.shape)}, {t.dtype} on "
        f"{t.device}): DLPack has no TPU device type. Use t.cpu() for a host tensor, or t.jax() for "
        f"the JAX array")


def _refusing(to_dlpack: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(to_dlpack)
    def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tensor, TpuTensor):
            raise _refusal(tensor)
        return to_dlpack(tensor, *args, **kwargs)
    return wrapper


def _dlpack(self: TpuTensor, *args: Any, **kwargs: Any) -> Any:
    raise _refusal(self)


TpuTensor.__dlpack__ = _dlpack
TpuTensor.__dlpack_device__ = _dlpack
torch.utils.dlpack.to_dlpack = _refusing(torch.utils.dlpack.to_dlpack)
torch.to_dlpack = torch.utils.dlpack.to_dlpack
