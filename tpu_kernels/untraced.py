"""Functions Dynamo must never trace, set up without importing ``torch._dynamo``.

``torch._disable_dynamo(fn)`` makes a function Dynamo runs as it is, but its first call
imports ``torch._dynamo`` (about 0.4 s) to build the real ``disable`` wrapper, which it
keeps on ``fn.__dynamo_disable``. Until Dynamo is imported nothing can be tracing, so a
stand-in put there calls ``fn`` directly and, at its first call after Dynamo is loaded,
builds the real wrapper and puts it in its own place.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch


def until_dynamo(fn: Callable, recursive: bool) -> Callable:
    """The stand-in for ``fn``'s ``__dynamo_disable`` (see the module docstring)."""
    def _stand_in_call(*args: Any, **kwargs: Any) -> Any:
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None or not hasattr(dynamo, "disable"):   # nothing can be tracing
            return fn(*args, **kwargs)
        real = dynamo.disable(fn, recursive, wrapping=False)
        setattr(fn, "__dynamo_disable", real)
        return real(*args, **kwargs)
    return _stand_in_call


def untraced(fn: Callable) -> Callable:
    """``fn``, and everything it calls, run as they are wherever Dynamo meets them: for a
    Python kernel torch's dispatcher calls, which inside compiled code's eager stretches
    (a graph break's) Dynamo would otherwise compile as a frame of its own. The guard
    costs about 1 µs a call once Dynamo is loaded, nothing before."""
    wrapper = torch._disable_dynamo(fn, recursive=True)
    setattr(fn, "__dynamo_disable", until_dynamo(fn, True))
    return wrapper
