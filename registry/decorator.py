"""``@tpu_kernel``: bind a JAX function (XLA lowering, Pallas or Helion kernel, user code)
to an op in the registry. Built-in lowerings and kernels use it exactly as users do.

    @tpu_kernel("aten::gelu", supports=lambda x, approximate="none": x.dtype == torch.bfloat16)
    def my_gelu(x, approximate="none"):
        return ...            # jax arrays in, jax arrays out

Misuse fails here, at decoration time: unknown op, a signature that cannot take the
op's arguments, the same function registered twice for an op without ``override=True``.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from tpu_kernels.registry.core import DEFAULT_PRIORITY, KINDS, REGISTRY, Impl, lookup_op


def resolve_overload(name: Any) -> Any:
    """An OpOverload from a name; a bare packet means its ``.default`` overload."""
    op = lookup_op(name)
    if hasattr(op, "overloads"):  # a packet
        if "default" in op.overloads():
            return op.default
        raise ValueError(
            f"op {name!r} has several overloads {op.overloads()}; name one, e.g. "
            f"\"{name}.{op.overloads()[0]}\"")
    return op


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
    Names of ops that do not exist yet (``"mylib::fused_rms_norm"``) define new custom
    ops; see ``custom_op.py``.
    """
    if not ops:
        raise TypeError("@tpu_kernel needs an op name, e.g. @tpu_kernel(\"aten::gelu\")")
    if kind not in KINDS:
        raise ValueError(f"@tpu_kernel: kind {kind!r} not one of {KINDS}")

    def deco(fn: Callable) -> Callable:
        for op_name in ops:
            if _is_new_custom_op(op_name):
                from tpu_kernels.registry.custom_op import define_custom_op
                return define_custom_op(op_name, fn, kind=kind, supports=supports,
                                        priority=priority, override=override, **custom)
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


def _is_new_custom_op(name: Any) -> bool:
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


def unregister(fn_or_impl: Any) -> None:
    """Remove the impls a decorated function registered (or one ``Impl``)."""
    impls = [fn_or_impl] if isinstance(fn_or_impl, Impl) else getattr(fn_or_impl, "tpu_impls", [])
    for impl in impls:
        REGISTRY.remove(impl)


def xla(*ops: Any, **kw: Any) -> Callable[[Callable], Callable]:
    """Register a built-in XLA lowering (pure jax.numpy / lax)."""
    return tpu_kernel(*ops, kind="xla", **kw)
