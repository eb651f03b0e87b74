"""Composite torch calls the tpu device runs as one op.

``F.cross_entropy`` is CompositeImplicitAutograd: torch would split it into
``log_softmax`` + ``nll_loss`` before the tpu tensor sees it, and the fused kernels
(one pass over the vocabulary) could never run. Registering ``cross_entropy_loss`` at
the ``AutogradPrivateUse1`` key catches the whole call on tpu tensors and routes it to
``tpu_kernels::cross_entropy`` (which has its own autograd); anything the fused op does
not cover (probability targets, spatial [N, C, d...] inputs) takes torch's own
decomposition, unchanged.
"""
from __future__ import annotations

import torch

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}
aten = torch.ops.aten


def _cross_entropy_loss(input, target, weight=None, reduction=1, ignore_index=-100,
                        label_smoothing=0.0):
    if input.dim() == 2 and not target.dtype.is_floating_point and target.dim() == 1:
        return torch.ops.tpu_kernels.cross_entropy(input, target, weight, ignore_index,
                                                   _REDUCTIONS[reduction], label_smoothing)
    return aten.cross_entropy_loss.default.decompose(input, target, weight, reduction,
                                                     ignore_index, label_smoothing)


def install() -> None:
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("cross_entropy_loss", _cross_entropy_loss, "AutogradPrivateUse1")
    install.lib = lib  # keep the registration alive
