"""tpu_kernels: PyTorch on TPUs through JAX, Pallas and Helion.

    import torch, tpu_kernels
    x = torch.randn(4, 8, device="tpu")
    model = torch.nn.Linear(8, 2).to("tpu")
    print(model(x).sum().item())

Every ATen op on a tpu tensor is looked up in one registry (``tpu_kernels.registry``)
and runs as a Pallas kernel, a Helion kernel, or an XLA lowering.
"""
from __future__ import annotations

from tpu_kernels import device as _device

_device.setup()  # before anything names torch.device("tpu")

from tpu_kernels import inplace_meta as _inplace_meta  # noqa: E402
from tpu_kernels import registry  # noqa: E402

_inplace_meta.install()

from tpu_kernels import compile_backend as _compile_backend  # noqa: E402

_compile_backend.register()
from tpu_kernels import distributed as _distributed  # noqa: E402

_distributed.install()   # c10d backend "tpu" (names only; loads when a group is made)
from tpu_kernels.registry import tpu_kernel  # noqa: E402
from tpu_kernels.deferred_mode import deferred, flush  # noqa: E402
from tpu_kernels.tensor import TpuTensor  # noqa: E402

__all__ = ["tpu_kernel", "registry", "TpuTensor", "deferred", "flush"]
