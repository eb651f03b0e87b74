"""torch's optimizers and ``clip_grad_norm_`` take their foreach paths for tpu tensors.

torch picks an optimizer's implementation by the parameters' type and device: the
foreach path (one ``torch._foreach_*`` op per update step over all parameters) when every
parameter is a plain ``Tensor`` or ``Parameter`` on a device that has foreach kernels
(``tpu`` is listed), else one op per parameter per step. A tpu tensor is a ``Tensor``
subclass, so without this AdamW on tpu ran the per-parameter loop: 292 ops a step for the
small GPT's 29 parameters, against 10 foreach ops (each one program over all of them).
Registering the type gives the choice torch makes for CUDA tensors; ``foreach=False``
still picks the loop.
"""
from __future__ import annotations

from torch.optim.optimizer import _foreach_supported_types as _OPTIMIZERS
from torch.utils._foreach_utils import _foreach_supported_types as _UTILITIES

from tpu_kernels.tensor import TpuTensor

# torch's lists of the tensor types its foreach paths take (optimizers; clip_grad_norm_
# and the other utilities of torch.utils._foreach_utils), mutated in place
_LISTS = (_OPTIMIZERS, _UTILITIES)


def install() -> None:
    """Idempotent: list the tpu tensor type where torch looks for foreach-capable types."""
    for types in _LISTS:
        if TpuTensor not in types:
            types.append(TpuTensor)
