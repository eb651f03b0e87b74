"""``torch.tpu.amp``: ``torch.cuda.amp``'s names for the tpu device.

Code written for CUDA's older API (``torch.cuda.amp.autocast()``, ``GradScaler()``,
``@custom_fwd``/``@custom_bwd`` on autograd Functions) runs with ``cuda`` read as ``tpu``.
Each name gives torch.amp's object for device ``"tpu"`` and, as CUDA's do, warns once per
call site that ``torch.amp``'s form is the current one. ``autocast``'s default dtype is the
device's (bfloat16), not CUDA's float16.
"""
from __future__ import annotations

import sys
import warnings
from typing import Any, Callable

import torch

from tpu_kernels.device import submodule


def _deprecated(name: str, current: str) -> None:
    warnings.warn(f"`torch.tpu.amp.{name}(args...)` is deprecated. Please use `{current}` instead.",
                  FutureWarning, stacklevel=3)


def autocast(enabled: bool = True, dtype: torch.dtype | None = None, cache_enabled: bool = True) -> torch.amp.autocast:
    """``torch.amp.autocast("tpu", ...)`` (its dtype the device's default when None)."""
    _deprecated("autocast", 'torch.amp.autocast("tpu", args...)')
    return torch.amp.autocast("tpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


def GradScaler(init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
               growth_interval: int = 2000, enabled: bool = True) -> torch.amp.GradScaler:
    """``torch.amp.GradScaler("tpu", ...)``."""
    _deprecated("GradScaler", 'torch.amp.GradScaler("tpu", args...)')
    return torch.amp.GradScaler("tpu", init_scale, growth_factor, backoff_factor, growth_interval, enabled)


def custom_fwd(fwd: Callable | None = None, *, cast_inputs: torch.dtype | None = None) -> Any:
    """``torch.amp.custom_fwd(fwd, device_type="tpu", cast_inputs=...)``."""
    _deprecated("custom_fwd", 'torch.amp.custom_fwd(args..., device_type="tpu")')
    return torch.amp.custom_fwd(fwd, device_type="tpu", cast_inputs=cast_inputs)


def custom_bwd(bwd: Callable | None = None) -> Any:
    """``torch.amp.custom_bwd(bwd, device_type="tpu")``."""
    _deprecated("custom_bwd", 'torch.amp.custom_bwd(args..., device_type="tpu")')
    return torch.amp.custom_bwd(bwd, device_type="tpu")


def install() -> None:
    """``torch.tpu.amp`` (importable as a module too: ``from torch.tpu.amp import autocast``)."""
    torch.tpu.amp = submodule("torch.tpu.amp", sys.modules[__name__],
                              ("autocast", "GradScaler", "custom_fwd", "custom_bwd"))
