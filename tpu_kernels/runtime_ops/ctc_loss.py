"""``F.ctc_loss`` with its length tensors on the CPU, as CUDA runs it.

``aten::ctc_loss.Tensor`` is CompositeImplicitAutograd. For plain tensors torch's kernel
reads the two length tensors into int lists and runs the ``IntList`` overload, whose
mean reduction divides by a length tensor it makes on the loss's device. For a tensor
subclass (every tpu tensor) it keeps the tensors, and its mean divides the tpu loss by
the CPU ``target_lengths``: "Expected all tensors to be on the same device". Caught at
``AutogradPrivateUse1``, a call whose lengths are both CPU tensors takes torch's
plain-tensor path; any other call (tpu lengths: no host read) decomposes as before.
"""
from __future__ import annotations

import torch

from tpu_kernels.registry import runtime_handler

aten = torch.ops.aten


def _on_the_cpu(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


@runtime_handler("aten::ctc_loss.Tensor", catch_at="AutogradPrivateUse1")
def ctc_loss(op, args, kwargs):
    if len(args) < 4 or not (_on_the_cpu(args[2]) and _on_the_cpu(args[3])):
        return op.decompose(*args, **kwargs)
    for name, t in zip(("input_lengths", "target_lengths"), args[2:4]):
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise RuntimeError(f"{name} must be integral")   # torch's own check, same words
    return aten.ctc_loss.IntList(*args[:2], args[2].long().tolist(), args[3].long().tolist(), *args[4:], **kwargs)
