"""``F.rms_norm`` on tpu as one op each way (``aten::_fused_rms_norm`` and its backward),
so the registry can run the Helion RMSNorm kernel.

``aten::rms_norm`` and ``aten::_fused_rms_norm`` are CompositeImplicitAutograd: for a
device with no kernel of its own, torch decomposes both into pow/mean/rsqrt/mul above
autograd, and the tpu tensor never sees the fused op. Two registrations change that:

- ``_fused_rms_norm`` gets a ``PrivateUse1`` kernel that hands the call to the tpu
  dispatcher (the registry's route: the Helion kernel or the XLA lowering). With a backend
  kernel present, torch's autograd uses the op's own derivative (``_fused_rms_norm_backward``,
  also a registry op) instead of the decomposition.
- ``rms_norm`` is caught at ``AutogradPrivateUse1`` and calls ``_fused_rms_norm``.

Under ``torch.compile`` AOTAutograd then records the two fused ops, not the decomposition.
"""
from __future__ import annotations

import torch

from tpu_kernels.dispatch import run
from tpu_kernels.registry import runtime_handler

_FUSED = torch.ops.aten._fused_rms_norm.default
_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("_fused_rms_norm", lambda *args, **kwargs: run(_FUSED, args, kwargs), "PrivateUse1")


@runtime_handler("aten::rms_norm", catch_at="AutogradPrivateUse1")
def rms_norm(op, args, kwargs):
    return _rms_norm(*args, **kwargs)


def _rms_norm(input, normalized_shape, weight=None, eps=None):
    _check_shapes(input, list(normalized_shape), weight)
    return _FUSED(input, normalized_shape, weight, eps)[0]


def _check_shapes(input: torch.Tensor, shape: list, weight: torch.Tensor | None) -> None:
    """CPU's ``rms_norm`` argument checks, with its messages: ``_fused_rms_norm``'s meta
    function makes none of them (a wrong ``normalized_shape`` gave a result)."""
    if not shape:
        raise RuntimeError("Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
                           f"least one element, but got normalized_shape = {shape}")
    if weight is not None and list(weight.shape) != shape:
        raise RuntimeError("Expected weight to be of same shape as normalized_shape, but got weight of "
                           f"shape {list(weight.shape)} and normalized_shape = {shape}")
    if input.dim() < len(shape):
        raise ValueError(f"Input tensor must have at least {len(shape)} dimensions, but got {input.dim()}")
    if list(input.shape[input.dim() - len(shape):]) != shape:
        expected = "[*" + ", ".join(str(n) for n in shape) + "]"
        raise RuntimeError(f"Given normalized_shape={shape}, expected input with shape {expected}, but got "
                           f"input of size{list(input.shape)}")
