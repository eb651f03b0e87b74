"""Factory ops (no tensor input, ``device="tpu"``) reach the dispatcher through
PrivateUse1 kernels: a tpu tensor's ``__torch_dispatch__`` never sees them."""
from __future__ import annotations

import functools

import torch

from tpu_kernels import devices
from tpu_kernels.dispatch.devices import made_on
from tpu_kernels.dispatch.results import laid_out
from tpu_kernels.dispatch.run import guarded_run, run as _run
from tpu_kernels.registry import REGISTRY
from tpu_kernels.registry.opnames import lookup_op

# Factory overloads routed to the registry for device="tpu" (others compose from these).
FACTORIES = (
    "empty.memory_format", "empty_strided", "zeros", "ones", "full", "arange",
    "arange.start", "arange.start_step", "scalar_tensor", "empty_permuted", "eye",
    "eye.m", "linspace", "logspace", "rand", "randn", "randint", "randint.low",
    "randperm", "tril_indices", "triu_indices", "normal.float_float", "rand.generator",
    "randn.generator", "randint.generator", "randint.low_generator", "randperm.generator",
    "_efficientzerotensor",
)
_LIB = torch.library.Library("aten", "IMPL")


_frame_callback = torch._C._dynamo.eval_frame.get_eval_frame_callback


def _factory_kernel(op, *args, **kwargs):
    i = devices.index(kwargs.get("device"))   # "tpu:5" with fewer devices raises here
    run = _run if _frame_callback() is None else guarded_run
    out = made_on(i, lambda: run(op, args, kwargs))
    fmt = kwargs.get("memory_format")
    return out if fmt is None else laid_out(out, out, fmt)


def install_factories() -> None:
    """A PrivateUse1 kernel for each factory the registry has an impl of."""
    for name in FACTORIES:
        op = lookup_op(f"aten::{name}" if "." in name else f"aten::{name}.default")
        if REGISTRY.has(op):
            _LIB.impl(name, functools.partial(_factory_kernel, op), "PrivateUse1")
