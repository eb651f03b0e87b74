"""``repr`` of a tpu tensor: torch's own formatting of a CPU copy, with the device shown."""
from __future__ import annotations

import re

import torch

_DTYPE_TAIL = re.compile(r"(, dtype=torch\.\w+)?\)$", re.S)


def tensor_repr(t: torch.Tensor, host: torch.Tensor) -> str:
    """``t``'s repr from ``host``, its values copied to the CPU."""
    body = repr(host)
    m = _DTYPE_TAIL.search(body)
    extra = ", device='tpu:0'" + (m.group(1) or "")
    if t.grad_fn is not None:
        extra += f", grad_fn=<{type(t.grad_fn).__name__}>"
    elif t.requires_grad:
        extra += ", requires_grad=True"
    return body[: m.start()] + extra + ")"
