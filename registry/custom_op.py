"""New custom ops from ``@tpu_kernel("mylib::name")``.

The schema comes from the function's type hints (``torch.library.infer_schema``); the op
is defined with ``torch.library`` so it runs in eager on tpu tensors (through the
registry, like any ATen op), under ``torch.compile`` (a fake impl from
``jax.eval_shape`` of the JAX function, or the user's), and on CPU tensors through the
``reference`` when one is given. ``backward`` adds autograd: ``"vjp"`` differentiates the
JAX function (use it for kernels with a ``jax.custom_vjp``), or a JAX function
``backward(grad, *args, **kwargs) -> grads`` (one per tensor argument, None allowed).
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import jax
import torch

from tpu_kernels.registry.core import DEFAULT_PRIORITY, REGISTRY, Impl
from tpu_kernels.registry.dtypes import to_jax_dtype, to_torch_dtype

_LIBS: dict[str, torch.library.Library] = {}
DEFINED: dict[str, "CustomOp"] = {}   # qualified name -> op, for introspection and reports


def _lib(ns: str) -> torch.library.Library:
    if ns not in _LIBS:
        _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    return _LIBS[ns]


class CustomOp:
    """What ``@tpu_kernel("ns::name")`` returns: call it like the op (defaults apply)."""

    def __init__(self, qualname: str, op: Any, jax_fn: Callable, reference: Callable | None,
                 signature: inspect.Signature) -> None:
        self.qualname, self.op, self.jax_fn, self.reference = qualname, op, jax_fn, reference
        self.__signature__ = signature
        self.__name__ = qualname.split("::")[1]
        self.__doc__ = getattr(jax_fn, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.op(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<tpu_kernel custom op {self.op._schema}>"


def _underlying(fn: Callable) -> tuple[Callable, Callable]:
    """(function with the type hints, pure-JAX callable). Helion kernels expose ``jax_fn``."""
    if type(fn).__name__ == "Kernel" and hasattr(fn, "jax_fn"):
        kernel = fn

        def helion_jax_fn(*args, **kwargs):
            from tpu_kernels.pallas.tpu_info import target
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


def define_custom_op(name: str, fn: Callable, *, kind: str = "user", supports: Callable | None = None,
                     priority: int | None = None, override: bool = False,
                     reference: Callable | None = None, backward: Any = None,
                     fake: Callable | None = None) -> CustomOp:
    """Define ``name`` as a new op whose tpu impl is ``fn`` (see module docstring)."""
    qualname = name.replace(".", "::", 1) if "::" not in name else name
    ns, opname = qualname.split("::")
    hinted, jax_fn = _underlying(fn)
    if qualname in DEFINED and not override:
        raise ValueError(f"@tpu_kernel: {qualname} is already defined; pass override=True to replace its impl")
    try:
        schema = torch.library.infer_schema(hinted, mutates_args=())
    except ValueError as exc:
        raise TypeError(f"@tpu_kernel({qualname!r}): a new op needs type hints on every parameter "
                        f"and the return ({exc})") from None
    if qualname in DEFINED:
        return _replace_impl(DEFINED[qualname], jax_fn, kind, supports, priority, schema)
    lib = _lib(ns)
    lib.define(opname + schema)
    op = getattr(getattr(torch.ops, ns), opname).default
    sig = inspect.signature(hinted)
    lib.impl(opname, fake or _fake_from_jax(jax_fn, op), "Meta")
    if reference is not None:
        lib.impl(opname, reference, "CPU")
    REGISTRY.add(Impl(op, jax_fn, kind, getattr(hinted, "__name__", opname), supports,
                      DEFAULT_PRIORITY[kind] if priority is None else priority))
    _register_autograd(ns, opname, op, schema, jax_fn, reference, backward)
    custom = CustomOp(qualname, op, jax_fn, reference, sig)
    DEFINED[qualname] = custom
    return custom


def _replace_impl(custom: CustomOp, jax_fn, kind, supports, priority, schema) -> CustomOp:
    if str(custom.op._schema).split("(", 1)[1] != schema[1:]:
        raise TypeError(f"@tpu_kernel: {custom.qualname} exists with schema {custom.op._schema}; "
                        f"override=True cannot change it to {schema}")
    for old in [i for i in REGISTRY.impls(custom.op) if i.fn is custom.jax_fn]:
        REGISTRY.remove(old)
    REGISTRY.add(Impl(custom.op, jax_fn, kind, getattr(jax_fn, "__name__", "impl"), supports,
                      DEFAULT_PRIORITY[kind] if priority is None else priority))
    custom.jax_fn = jax_fn
    return custom


# -- fake (meta) impls -------------------------------------------------------------------
def _fake_from_jax(jax_fn: Callable, op: Any) -> Callable:
    """Result metadata from ``jax.eval_shape`` of the JAX function on abstract inputs."""
    def fake(*args, **kwargs):
        device = next((a.device for a in _tensors(args, kwargs)), torch.device("meta"))
        a, kw = _abstract(args), {k: _abstract(v) for k, v in kwargs.items()}
        # only arrays are abstract; Python values are closed over, as the dispatcher does
        pos = [i for i, v in enumerate(a) if _is_array_tree(v)]

        def f(*arrays):
            full = list(a)
            for i, x in zip(pos, arrays):
                full[i] = x
            return jax_fn(*full, **kw)
        out = jax.eval_shape(f, *(a[i] for i in pos))
        return _empty_like_tree(out, device)
    fake.__name__ = f"{op}_fake"
    return fake


def _tensors(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if isinstance(x, torch.Tensor))


def _is_array_tree(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return len(v) > 0 and all(_is_array_tree(x) for x in v)
    return isinstance(v, jax.ShapeDtypeStruct)


def _abstract(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return jax.ShapeDtypeStruct(tuple(v.shape), to_jax_dtype(v.dtype))
    if isinstance(v, (list, tuple)):
        return type(v)(_abstract(x) for x in v)
    return v


def _empty_like_tree(out: Any, device: torch.device) -> Any:
    if isinstance(out, (list, tuple)):
        return type(out)(_empty_like_tree(o, device) for o in out)
    return torch.empty(out.shape, dtype=to_torch_dtype(out.dtype), device=device)


# -- autograd ------------------------------------------------------------------------------
def _register_autograd(ns, opname, op, schema, jax_fn, reference, backward) -> None:
    arg_names = [a.name for a in op._schema.arguments]
    tensor_pos = [i for i, a in enumerate(op._schema.arguments) if str(a.type) == "Tensor"
                  or str(a.type) == "Optional[Tensor]"]
    if backward is None:
        def no_backward(ctx, *grads):
            raise RuntimeError(
                f"{ns}::{opname} has no backward: pass backward=<jax fn> or backward=\"vjp\" to "
                f"@tpu_kernel(\"{ns}::{opname}\", ...) to differentiate it")
        torch.library.register_autograd(f"{ns}::{opname}", no_backward, setup_context=lambda ctx, inputs, output: None)
        return
    bwd_jax = _vjp_backward(jax_fn, tensor_pos) if backward == "vjp" else _user_backward(backward, tensor_pos)
    n_out = len(op._schema.returns)
    bname = f"{opname}_backward"
    args_sig = schema[1:schema.index(") ->")]
    lib = _lib(ns)
    lib.define(f"{bname}(Tensor[] grads, {args_sig}) -> Tensor[]")
    bop = getattr(getattr(torch.ops, ns), bname).default

    def bwd_fake(grads, *args, **kwargs):
        # absent (None or defaulted) tensor args get an empty placeholder grad
        return [torch.empty_like(args[i]) if i < len(args) and args[i] is not None
                else torch.empty(0, device=grads[0].device) for i in tensor_pos]
    lib.impl(bname, bwd_fake, "Meta")
    if reference is not None:
        lib.impl(bname, _reference_backward(reference, tensor_pos), "CPU")
    REGISTRY.add(Impl(bop, bwd_jax, "xla", bname, None, DEFAULT_PRIORITY["xla"]))

    def setup_context(ctx, inputs, output):
        ctx.inputs = inputs
        ctx.outputs = output if isinstance(output, (list, tuple)) else (output,)

    def autograd_bwd(ctx, *grads):
        grads = [g if g is not None else torch.zeros_like(o) for g, o in zip(grads[:n_out], ctx.outputs)]
        outs = bop(grads, *ctx.inputs)
        result = [None] * len(arg_names)
        for i, g in zip(tensor_pos, outs):
            if i < len(ctx.inputs) and isinstance(ctx.inputs[i], torch.Tensor) and ctx.inputs[i].requires_grad:
                result[i] = g
        return tuple(result)

    torch.library.register_autograd(f"{ns}::{opname}", autograd_bwd, setup_context=setup_context)


def _present(args: tuple, tensor_pos: list[int]) -> list[int]:
    return [i for i in tensor_pos if i < len(args) and args[i] is not None]


def _vjp_backward(jax_fn: Callable, tensor_pos: list[int]) -> Callable:
    def bwd(grads, *args, **kwargs):
        live = _present(args, tensor_pos)

        def f(*tensors):
            full = list(args)
            for i, t in zip(live, tensors):
                full[i] = t
            return jax_fn(*full, **kwargs)
        primals = [args[i] for i in live]
        # integer inputs (indices) have no gradient: differentiate w.r.t. floats only
        out, vjp = jax.vjp(f, *primals)
        cot = grads[0] if len(grads) == 1 else tuple(grads)
        got = dict(zip(live, vjp(cot)))
        return [_grad_or_empty(got.get(i), args, i) for i in tensor_pos]
    return bwd


def _grad_or_empty(g: Any, args: tuple, i: int) -> jax.Array:
    if g is None or i >= len(args) or args[i] is None:
        return jax.numpy.zeros((0,), jax.numpy.float32)
    if g.dtype == jax.dtypes.float0:  # integer input
        return jax.numpy.zeros(args[i].shape, args[i].dtype)
    return g


def _user_backward(backward: Callable, tensor_pos: list[int]) -> Callable:
    def bwd(grads, *args, **kwargs):
        g = backward(grads[0] if len(grads) == 1 else tuple(grads), *args, **kwargs)
        g = dict(zip(tensor_pos, g if isinstance(g, (list, tuple)) else (g,)))
        return [_grad_or_empty(g.get(i), args, i) if g.get(i) is not None or i >= len(args) or args[i] is None
                else jax.numpy.zeros_like(args[i]) for i in tensor_pos]
    return bwd


def _reference_backward(reference: Callable, tensor_pos: list[int]) -> Callable:
    def bwd(grads, *args, **kwargs):
        with torch.enable_grad():
            live = [i for i in _present(args, tensor_pos) if args[i].is_floating_point()]
            ins = [args[i].detach().requires_grad_() for i in live]
            full = list(args)
            for i, t in zip(live, ins):
                full[i] = t
            out = reference(*full, **kwargs)
            outs = out if isinstance(out, (list, tuple)) else (out,)
            got = dict(zip(live, torch.autograd.grad(outs, ins, list(grads), allow_unused=True)))
        return [got[i] if got.get(i) is not None else
                (torch.zeros_like(args[i]) if i < len(args) and args[i] is not None else torch.empty(0))
                for i in tensor_pos]
    return bwd

