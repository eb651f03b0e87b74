"""Convolution results in torch's memory format.

torch's CPU (mkldnn, slow2d) and CUDA (cudnn) convolutions return channels-last results
(the output; in backward the input's and the weight's gradients) when the input or the
weight is channels-last (their ``suggest_memory_format``), and contiguous ones otherwise.
torch's meta function leaves every result contiguous (a meta tensor names no backend),
so the layout is chosen here per call: it depends on the arguments' strides, which a
cached signature does not hold.
"""
from __future__ import annotations

from typing import Any

import torch
from torch._prims_common import suggest_memory_format

from tpu_kernels.dispatch import run_call
from tpu_kernels.dispatch.results import laid_out
from tpu_kernels.registry import runtime_handler

_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _in_format(t: Any, x: torch.Tensor, w: torch.Tensor) -> Any:
    """``t`` (a result, or None) channels-last if torch's backends would make it so."""
    fmt = _CHANNELS_LAST.get(x.dim())
    if t is None or fmt is None or not any(suggest_memory_format(a) == fmt for a in (x, w)):
        return t
    return laid_out(t, t, fmt)


@runtime_handler("aten::convolution")
def convolution(op, args, kwargs):
    return _in_format(run_call(op, args, kwargs), args[0], args[1])


@runtime_handler("aten::convolution_backward")
def convolution_backward(op, args, kwargs):
    grad_input, grad_weight, grad_bias = run_call(op, args, kwargs)
    x, w = args[1], args[2]
    return _in_format(grad_input, x, w), _in_format(grad_weight, x, w), grad_bias
