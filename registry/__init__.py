"""The op table: ATen op -> impls (Pallas, Helion, XLA lowering, user, runtime).

    from tpu_kernels import registry
    registry.impls("aten::mm")               # every impl, highest priority first
    registry.which("aten::mm", a, b)         # the impl that runs for these arguments, and why
    registry.route(op, margs, mkwargs)       # the whole answer: handler, impl, twin, decomposition...
    registry.which(torch.ops.higher_order.flex_attention, spec)   # a higher-order op: its FlexSpec
    with registry.only("xla"): ...           # force the XLA lowerings
    with registry.disable("pallas"): ...

Importing this package declares this library's ops and loads the built-in XLA lowerings
and kernel bindings. The registry never imports the runtime (``tpu_kernels.dispatch``
and friends): the runtime registers its own handlers here (``register_runtime``).
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

# declared first, then the impls: XLA lowerings, then kernel bindings
from tpu_kernels.registry import custom_ops
from tpu_kernels.registry.custom_ops import library as _library  # noqa: F401  (declares tpu_kernels::*)
from tpu_kernels.registry import xla as _xla  # noqa: F401  (registers the lowerings)
from tpu_kernels.registry import bindings as _bindings  # noqa: F401  (binds Pallas/Helion kernels)
from tpu_kernels.registry.core import REGISTRY, Impl
from tpu_kernels.registry.custom_ops import declare_op
from tpu_kernels.registry.decorator import tpu_kernel, unregister
from tpu_kernels.registry.kinds import KINDS
from tpu_kernels.registry.opnames import lookup_op, resolve_overload
from tpu_kernels.registry.route import Route, decomposition, route
from tpu_kernels.registry.runtime import register_runtime, register_runtime_rule, runtime_handler

disable = REGISTRY.disable
only = REGISTRY.only
force = REGISTRY.force
interpret = REGISTRY.interpret


def impls(op: Any) -> list[Impl]:
    """Every impl registered for ``op`` (name, OpOverload or higher-order op), highest
    priority first."""
    return REGISTRY.impls(resolve_overload(op))


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def which(op: Any, *args: Any, **kwargs: Any) -> tuple[Impl | None, list[tuple[Impl, str]]]:
    """The impl that would run for these arguments (a runtime handler, a registered impl,
    the functional twin's impl of an in-place op, the decomposition, the CPU fallback;
    None when the op is refused), and each skipped impl with its reason. For a higher-order
    op the one argument is its spec (flex_attention: ``registry.xla.flex_attention.spec_of``)."""
    r = route(resolve_overload(op), tree_map(_meta, args), tree_map(_meta, kwargs))
    return r.impl, list(r.skipped)


__all__ = ["KINDS", "REGISTRY", "Impl", "Route", "tpu_kernel", "unregister", "impls", "which", "route",
           "disable", "only", "force", "interpret", "lookup_op", "resolve_overload", "decomposition",
           "declare_op", "custom_ops", "register_runtime", "register_runtime_rule", "runtime_handler"]
