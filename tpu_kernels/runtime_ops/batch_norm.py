"""``native_batch_norm`` updates the running stats in place without saying so in its
schema; ``_native_batch_norm_legit`` means the same and declares the mutation."""
from __future__ import annotations

import torch

from tpu_kernels.dispatch import run_call
from tpu_kernels.registry import runtime_handler

_NAMES = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")


@runtime_handler("aten::native_batch_norm")
def native_batch_norm(op, args, kwargs):
    a = list(args) + [None] * (8 - len(args))
    a = [kwargs.get(n, v) for n, v in zip(_NAMES, a)]
    if a[5] and a[3] is not None:
        return torch.ops.aten._native_batch_norm_legit.default(*a)
    return run_call(op, args, kwargs)
