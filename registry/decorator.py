"""``@tpu_kernel``: bind a JAX function (XLA lowering, Pallas or Helion kernel, user code)
to an op in the registry. Built-in lowerings and kernels use it exactly as users do.

    @tpu_kernel("aten::gelu", supports=lambda x, approximate="none": x.dtype == torch.bfloat16)
    def my_gelu(x, approximate="none"):
        return ...            # jax arrays in, jax arrays out

Misuse fails here, at decoration time: unknown op, a signature that cannot take the
op's arguments, the same function registered twice for an op without ``override=True``.
A user kernel for an op that does not exist yet (``"mylib::fused_rms_norm"``) declares
it first (``custom_ops.declare_op``: schema from the type hints, ``reference``,
``backward``, ``fake``) and then adds itself as its impl; built-in kernels only bind to
ops declared beforehand (``custom_ops/library.py``).
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

from tpu_kernels.pallas.tpu_info import target
from tpu_kernels.registry.core import REGISTRY, Impl
from tpu_kernels.registry.custom_ops.define import CustomOp, add_impl, declare_op
from tpu_kernels.registry.kinds import DEFAULT_PRIORITY, REGISTERED_KINDS
from tpu_kernels.registry.opnames import lookup_op, resolve_overload

_DECORATOR_KINDS = tuple(k for k in REGISTERED_KINDS if k != "runtime")   # runtime: registry.runtime


def check_signature(fn: Callable, op: Any) -> None:
    """``fn`` must accept the op's positional args by position and kwarg-only args by name."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins, jitted callables: cannot check
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        kw_ok = None
    else:
        kw_ok = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    schema = op._schema
    pos_args = [a for a in schema.arguments if not a.kwarg_only]
    kw_args = [a for a in schema.arguments if a.kwarg_only]
    where = f"{getattr(fn, '__name__', fn)}{sig} for {schema}"
    if not var_pos and len(positional) < len(pos_args):
        raise TypeError(f"@tpu_kernel: {where}: takes {len(positional)} positional args, "
                        f"the op passes up to {len(pos_args)}")
    required = [p for p in positional if p.default is p.empty]
    if len(required) > len(pos_args):
        raise TypeError(f"@tpu_kernel: {where}: requires {len(required)} positional args, "
                        f"the op has only {len(pos_args)}")
    if kw_ok is not None:
        missing = [a.name for a in kw_args if a.name not in kw_ok]
        if missing:
            raise TypeError(f"@tpu_kernel: {where}: does not accept keyword argument(s) {missing}")


def tpu_kernel(*ops: Any, kind: str = "user", supports: Callable[..., Any] | None = None,
               priority: int | None = None, static: tuple[str, ...] = (),
               data_dependent: bool = False, random: bool = False, name: str | None = None,
               override: bool = False, **custom: Any) -> Callable[[Callable], Callable]:
    """Register the decorated JAX function as an impl of each op in ``ops``.

    ``supports(*args, **kwargs)`` sees the op's arguments as torch (meta) tensors and
    Python values; it returns True/None to accept, False or a reason string to refuse.
    It is evaluated once per argument signature (shapes, dtypes, static values).
    A user kernel naming an op that does not exist yet declares it (``reference``,
    ``backward`` and ``fake`` go to ``declare_op``) and returns the new op.
    """
    if not ops:
        raise TypeError("@tpu_kernel needs an op name, e.g. @tpu_kernel(\"aten::gelu\")")
    if kind not in _DECORATOR_KINDS:
        raise ValueError(f"@tpu_kernel: kind {kind!r} not one of {_DECORATOR_KINDS}")

    def deco(fn: Callable) -> Callable:
        for op_name in ops:
            if _is_new_op(op_name):
                if kind != "user":   # built-in kernels bind to declared ops only
                    raise ValueError(
                        f"@tpu_kernel({op_name!r}, kind={kind!r}): no such op; declare it first "
                        f"(registry.declare_op; this library's ops: registry/custom_ops/library.py)")
                return _declare_and_add(op_name, fn, kind, supports, priority, custom)
            op = resolve_overload(op_name)
            if custom:
                raise TypeError(f"@tpu_kernel({op_name!r}): {sorted(custom)} only apply to new custom ops")
            check_signature(fn, op)
            impl_name = name or getattr(fn, "__name__", repr(fn))
            clash = [i for i in REGISTRY.impls(op) if i.kind == kind and i.name == impl_name]
            if clash and not override:
                raise ValueError(
                    f"@tpu_kernel: {op} already has a {kind} impl named {impl_name!r}; pass "
                    f"override=True to replace it")
            for old in clash:
                REGISTRY.remove(old)
            impl = Impl(op, fn, kind, impl_name, supports,
                        DEFAULT_PRIORITY[kind] if priority is None else priority,
                        tuple(static), data_dependent, random)
            REGISTRY.add(impl)
            if hasattr(fn, "__dict__"):
                fn.__dict__.setdefault("tpu_impls", []).append(impl)
        return fn

    return deco


def _is_new_op(name: Any) -> bool:
    """True for the name of an op that does not exist yet (a user's new op)."""
    if not isinstance(name, str):
        return False
    if "::" not in name and "." not in name:
        raise ValueError(f"@tpu_kernel: op name {name!r} needs a namespace, e.g. \"mylib::{name}\"")
    ns = name.replace("::", ".").split(".")[0]
    if ns in ("aten", "prims"):
        return False
    try:
        lookup_op(name)
        return False
    except ValueError:
        return True


def _declare_and_add(name: str, fn: Callable, kind: str, supports, priority, custom: dict) -> CustomOp:
    """Declare ``name`` from ``fn``'s type hints, then add ``fn`` as its impl."""
    hinted, jax_fn = _underlying(fn)
    custom_op = declare_op(name, hinted, **custom)
    add_impl(custom_op.op, jax_fn, kind, getattr(hinted, "__name__", custom_op.__name__), supports, priority)
    return custom_op


def _underlying(fn: Callable) -> tuple[Callable, Callable]:
    """(function with the type hints, pure-JAX callable). Helion kernels expose ``jax_fn``."""
    if type(fn).__name__ == "Kernel" and hasattr(fn, "jax_fn"):
        kernel = fn

        def helion_jax_fn(*args, **kwargs):
            return _for_interpret(kernel, target().interpret).jax_fn(*args, **kwargs)
        helion_jax_fn.__name__ = getattr(kernel.fn, "__name__", "helion_kernel")
        return kernel.fn, helion_jax_fn
    return fn, fn


_VARIANTS: dict[tuple[int, bool], Any] = {}


def _for_interpret(kernel: Any, interpret: bool) -> Any:
    """``kernel`` with Helion's ``pallas_interpret`` setting = ``interpret``: the launcher
    then gets the flag explicitly (not from the HELION_PALLAS_INTERPRET variable)."""
    if kernel.settings.pallas_interpret == interpret:
        return kernel
    key = (id(kernel), interpret)
    if key not in _VARIANTS:
        settings = dataclasses.replace(kernel.settings, pallas_interpret=interpret)
        _VARIANTS[key] = type(kernel)(kernel.fn, configs=kernel.configs, settings=settings)
    return _VARIANTS[key]


def unregister(fn_or_impl: Any) -> None:
    """Remove the impls a decorated function registered (or one ``Impl``)."""
    impls = [fn_or_impl] if isinstance(fn_or_impl, Impl) else getattr(fn_or_impl, "tpu_impls", [])
    for impl in impls:
        REGISTRY.remove(impl)


def xla(*ops: Any, **kw: Any) -> Callable[[Callable], Callable]:
    """Register a built-in XLA lowering (pure jax.numpy / lax)."""
    return tpu_kernel(*ops, kind="xla", **kw)
