"""Runtime handlers: ops the tpu runtime handles itself, registered as impls of kind
``runtime`` so that ``registry.impls(op)`` and the route tell the truth about them.

    @runtime_handler("aten::_local_scalar_dense")
    def item(op, args, kwargs):            # tpu tensors in, torch values out
        ...

A handler is called as ``fn(op, args, kwargs)`` on the call's own arguments (tpu
tensors, not jax arrays) and takes every call of its op; it may hand a call on with
``tpu_kernels.dispatch.run_call``. ``catch_at`` names a dispatch key where torch should
give the op to the handler (``"AutogradPrivateUse1"`` for composite calls that would
otherwise decompose before a tpu tensor sees them, ``"PrivateUse1"`` for ops torch sends
to the device's kernels).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from tpu_kernels.registry.core import REGISTRY, Impl, Rule
from tpu_kernels.registry.kinds import DEFAULT_PRIORITY
from tpu_kernels.registry.opnames import base_name, namespace, resolve_overload
from tpu_kernels.untraced import untraced

Handler = Callable[[Any, tuple, dict], Any]
_LIBS: dict[str, torch.library.Library] = {}
_CAUGHT: set[tuple[Any, str]] = set()   # (op, dispatch key) with a kernel that calls the handler


def register_runtime(op: Any, fn: Handler, *, name: str | None = None, catch_at: str | None = None) -> Impl:
    """Make ``fn`` the runtime's handler of ``op`` (an OpOverload or its name); replaces
    an earlier handler of the op."""
    overload = resolve_overload(op)
    for old in [i for i in REGISTRY.impls(overload) if i.kind == "runtime" and i.op is overload]:
        REGISTRY.remove(old)
    impl = REGISTRY.add(Impl(overload, fn, "runtime", name or getattr(fn, "__name__", "handler"),
                             priority=DEFAULT_PRIORITY["runtime"]))
    if catch_at is not None and (overload, catch_at) not in _CAUGHT:
        _catch(overload, catch_at)
    return impl


def runtime_handler(*ops: Any, name: str | None = None, catch_at: str | None = None) -> Callable[[Handler], Handler]:
    """Decorator form of ``register_runtime`` for one or more ops."""
    def deco(fn: Handler) -> Handler:
        for op in ops:
            register_runtime(op, fn, name=name, catch_at=catch_at)
        return fn
    return deco


def register_runtime_rule(name: str, applies: Callable[[Any], bool], fn: Handler) -> Rule:
    """A handler for every op ``applies(op)`` accepts (a class of ops, e.g. views)."""
    return REGISTRY.add_rule(Rule(name, applies, fn))


def _catch(op: Any, key: str) -> None:
    """A kernel at ``key`` that calls the op's current handler (torch keeps one per key)."""
    ns, name = namespace(op), base_name(op)
    lib = _LIBS.get(ns)
    if lib is None:
        lib = _LIBS[ns] = torch.library.Library(ns, "IMPL")

    def kernel(*args: Any, **kwargs: Any) -> Any:
        return REGISTRY.runtime_handler(op).fn(op, args, kwargs)
    # untraced: torch calls the kernel from C++, and in the eager stretch of a compiled
    # function (after a graph break) Dynamo would compile it, tracing the runtime
    lib.impl(name if op._overloadname == "default" else f"{name}.{op._overloadname}", untraced(kernel), key)
    _CAUGHT.add((op, key))
