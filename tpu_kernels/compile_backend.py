"""``torch.compile(model, backend="tpu")``: what works today, and what does not yet.

Dynamo cannot capture ops on tpu tensors: they are a Python tensor subclass with
``__torch_dispatch__`` and no ``__tensor_flatten__`` (their data is a jax.Array, not
torch tensors), so Dynamo breaks the graph at each of them and runs them eagerly through
the registry (``dispatch.entry`` is ``torch._dynamo.disable``-d so Dynamo never traces
into JAX). The ``tpu`` backend therefore gets only the torch code between tpu ops; it
runs those graphs with the tpu ops they contain recorded and fused (deferred mode).
Results are eager's. For whole-step fusion today use ``tpu_kernels.deferred()``.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from tpu_kernels.deferred_mode import deferred


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
    def run(*args: Any) -> Any:
        with deferred():
            return gm(*args)
    return run


def register() -> None:
    from torch._dynamo import list_backends, register_backend
    if "tpu" not in list_backends(exclude_tags=()):
        register_backend(tpu_backend, name="tpu")
