"""The op table: ATen op -> impls (Pallas, Helion, XLA lowering, user, decomposition).

    from tpu_kernels import registry
    registry.impls("aten::mm")               # every impl, highest priority first
    registry.which("aten::mm", a, b)         # the impl that runs for these arguments, and why
    with registry.only("xla"): ...           # force the XLA lowerings
    with registry.disable("pallas"): ...

Importing this package loads the built-in XLA lowerings and kernel bindings. The
registry never imports the runtime (``tpu_kernels.dispatch`` and friends).
"""
from __future__ import annotations

from typing import Any

from tpu_kernels.registry.core import KINDS, REGISTRY, Impl, lookup_op
from tpu_kernels.registry.decorator import resolve_overload, tpu_kernel, unregister

disable = REGISTRY.disable
only = REGISTRY.only
force = REGISTRY.force
interpret = REGISTRY.interpret


def impls(op: Any) -> list[Impl]:
    """Every impl registered for ``op`` (name or OpOverload), highest priority first."""
    return REGISTRY.impls(resolve_overload(op))


def which(op: Any, *args: Any, **kwargs: Any) -> tuple[Impl | None, list[tuple[Impl, str]]]:
    """The impl that would run for these arguments, and each skipped impl with its reason."""
    from torch.utils._pytree import tree_map

    import torch

    def meta(x):
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return x
    overload = resolve_overload(op)
    impl, skipped = REGISTRY.resolve(overload, tree_map(meta, args), tree_map(meta, kwargs))
    if impl is None:
        impl = decomposition(overload)
    return impl, skipped


def decomposition(op: Any) -> Impl | None:
    """torch's decomposition of ``op`` as a ``decomp`` impl (what runs when nothing is
    registered), or None."""
    from torch._decomp import decomposition_table
    fn = decomposition_table.get(op)
    if fn is None or REGISTRY.disabled("decomp"):
        return None
    return Impl(op, fn, "decomp", "torch._decomp", priority=0)


def _load_builtins() -> None:
    from tpu_kernels.registry import xla  # noqa: F401  (registers the lowerings)
    from tpu_kernels.registry import kernels  # noqa: F401  (binds Pallas/Helion kernels)


_load_builtins()

__all__ = ["KINDS", "REGISTRY", "Impl", "tpu_kernel", "unregister", "impls", "which", "disable",
           "only", "force", "interpret", "lookup_op", "resolve_overload", "decomposition"]
