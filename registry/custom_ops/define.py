"""Declaring a new op (``torch.ops.<ns>.<name>``): its schema, result metadata, CPU
reference and autograd. Declaring is one step; impls are added to the declared op like
to any ATen op (``@tpu_kernel("ns::name", kind=...)``).

    declare_op("mylib::scale", signature, reference=torch_fn, backward="vjp")

The schema comes from ``signature``'s type hints (``torch.library.infer_schema``); the op
is defined with ``torch.library`` so it runs in eager on tpu tensors (through the
registry, like any ATen op), under ``torch.compile`` (a fake impl from ``jax.eval_shape``
of the op's closing impl, or the one given), and on CPU tensors through ``reference``.
``backward`` adds autograd: ``"vjp"`` differentiates the op's closing impl (its lowest
priority one: the XLA lowering for this library's ops), or a JAX function
``backward(grad, *args, **kwargs) -> grads`` (one per tensor argument, None allowed).
``torch_backward(ctx, grad) -> grads`` instead gives the gradients in torch ops on the
inputs (``inputs_of(ctx)``, ``ctx.needs_input_grad``): differentiable again, and computing
only the gradients that are needed. Tensor inputs are kept with ``save_for_backward``, so
a backward frees them as it does torch's own ops' (a loss that is kept does not keep
the activations alive).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import jax
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from tpu_kernels.registry.core import REGISTRY, Impl
from tpu_kernels.registry.dtypes import to_jax_dtype, to_torch_dtype
from tpu_kernels.registry.kinds import DEFAULT_PRIORITY

_LIBS: dict[str, torch.library.Library] = {}
DECLARED: dict[str, "CustomOp"] = {}   # qualified name -> op, for introspection and reports


def _lib(ns: str) -> torch.library.Library:
    if ns not in _LIBS:
        _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    return _LIBS[ns]


class CustomOp:
    """A declared op: call it like the op (defaults apply)."""

    def __init__(self, qualname: str, op: Any, reference: Callable | None, signature: inspect.Signature,
                 doc: str | None) -> None:
        self.qualname, self.op, self.reference = qualname, op, reference
        self.__signature__ = signature
        self.__name__ = qualname.split("::")[1]
        self.__doc__ = doc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.op(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<tpu_kernel custom op {self.op._schema}>"


def _qualified(name: str) -> str:
    """``"mylib::op"`` for ``"mylib::op"`` or ``"mylib.op"``."""
    return name.replace(".", "::", 1) if "::" not in name else name


def _infer_schema(signature: Callable, qualname: str) -> str:
    try:
        return torch.library.infer_schema(signature, mutates_args=())
    except ValueError as exc:
        raise TypeError(f"@tpu_kernel({qualname!r}): a new op needs type hints on every parameter "
                        f"and the return ({exc})") from None


def declare_op(name: str, signature: Callable, *, reference: Callable | None = None, backward: Any = None,
               fake: Callable | None = None, backward_static: tuple[str, ...] = (),
               torch_backward: Callable | None = None) -> CustomOp:
    """Define ``name`` (``"ns::op"``) with the schema of ``signature``'s type hints.
    ``backward_static``: scalar args the backward's impl needs as values at trace time
    (as ``@tpu_kernel(static=...)`` for the op's own impls)."""
    qualname = _qualified(name)
    if qualname in DECLARED:
        raise ValueError(f"@tpu_kernel: {qualname} is already defined")
    ns, opname = qualname.split("::")
    schema = _infer_schema(signature, qualname)
    lib = _lib(ns)
    lib.define(opname + schema)
    op = getattr(getattr(torch.ops, ns), opname).default
    # a fake impl (run under FakeTensorMode, so torch code in it sees symbolic sizes), also
    # the op's Meta kernel
    torch.library.register_fake(qualname, fake or _fake_from_closing_impl(op, reference), lib=lib)
    if reference is not None:
        lib.impl(opname, reference, "CPU")
    if torch_backward is not None:
        torch.library.register_autograd(qualname, torch_backward, setup_context=_keep_inputs)
    else:
        _register_autograd(ns, opname, op, schema, reference, backward, tuple(backward_static))
    custom = CustomOp(qualname, op, reference, inspect.signature(signature), getattr(signature, "__doc__", None))
    DECLARED[qualname] = custom
    return custom


def closing_impl(op: Any) -> Callable:
    """The JAX function of ``op``'s lowest-priority impl (the one every list ends with)."""
    impls = [i for i in REGISTRY.impls(op) if i.kind != "runtime"]
    if not impls:
        raise NotImplementedError(f"{op} is declared but has no impl yet: add one with @tpu_kernel(\"{op._schema.name}\")")
    return impls[-1].fn


def add_impl(op: Any, fn: Callable, kind: str, name: str, supports: Callable | None,
             priority: int | None) -> Impl:
    return REGISTRY.add(Impl(op, fn, kind, name, supports, DEFAULT_PRIORITY[kind] if priority is None else priority))


# -- fake (meta) impls -------------------------------------------------------------------
def _fake_from_closing_impl(op: Any, reference: Callable | None = None) -> Callable:
    """Result metadata from ``jax.eval_shape`` of the op's closing impl on abstract inputs;
    for inputs with symbolic sizes (``torch.compile(dynamic=True)``), from ``reference``
    run on the fake tensors when it can: JAX's shapes are integers, so eval_shape would fix
    every symbolic size to its current value (a recompile for each new size)."""
    def fake(*args, **kwargs):
        if reference is not None and any(_symbolic(t) for t in _tensors(args, kwargs)):
            try:
                return reference(*args, **kwargs)
            except _DATA_DEPENDENT:     # a reference that reads values: sizes fixed below
                pass
        jax_fn = closing_impl(op)
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


_DATA_DEPENDENT = (DataDependentOutputException, GuardOnDataDependentSymNode)


def _symbolic(t: torch.Tensor) -> bool:
    return any(isinstance(n, torch.SymInt) for n in t.shape)


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
_SAVED = object()   # in ``ctx.kept``: a tensor input, kept with save_for_backward


def _keep_inputs(ctx, inputs, output) -> None:
    ctx.save_for_backward(*(a for a in inputs if isinstance(a, torch.Tensor)))
    ctx.kept = tuple(_SAVED if isinstance(a, torch.Tensor) else a for a in inputs)


def inputs_of(ctx) -> tuple:
    """The op's inputs, as ``_keep_inputs`` kept them."""
    saved = iter(ctx.saved_tensors)
    return tuple(next(saved) if a is _SAVED else a for a in ctx.kept)


def _register_autograd(ns, opname, op, schema, reference, backward, static=()) -> None:
    arg_names = [a.name for a in op._schema.arguments]
    tensor_pos = [i for i, a in enumerate(op._schema.arguments) if str(a.type) == "Tensor"
                  or str(a.type) == "Optional[Tensor]"]
    if backward is None:
        def no_backward(ctx, *grads):
            raise RuntimeError(
                f"{ns}::{opname} has no backward: pass backward=<jax fn> or backward=\"vjp\" to "
                f"@tpu_kernel(\"{ns}::{opname}\", ...) (or declare_op) to differentiate it")
        torch.library.register_autograd(f"{ns}::{opname}", no_backward, setup_context=lambda ctx, inputs, output: None)
        return
    bwd_jax = _vjp_backward(op, tensor_pos) if backward == "vjp" else _user_backward(backward, tensor_pos)
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
    REGISTRY.add(Impl(bop, bwd_jax, "xla", bname, None, DEFAULT_PRIORITY["xla"], static=static))

    def setup_context(ctx, inputs, output):
        _keep_inputs(ctx, inputs, output)
        outs = output if isinstance(output, (list, tuple)) else (output,)
        ctx.out_meta = [(o.shape, o.dtype, o.device) for o in outs]   # zeros for absent grads

    def autograd_bwd(ctx, *grads):
        inputs = inputs_of(ctx)
        if reference is not None and torch.is_grad_enabled():
            return _reference_grads(reference, inputs, grads[:n_out], len(arg_names), tensor_pos)
        grads = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                 for g, (shape, dtype, device) in zip(grads[:n_out], ctx.out_meta)]
        outs = bop(grads, *inputs)
        result = [None] * len(arg_names)
        for i, g in zip(tensor_pos, outs):
            if i < len(inputs) and isinstance(inputs[i], torch.Tensor) and ctx.needs_input_grad[i]:
                result[i] = g
        return tuple(result)

    torch.library.register_autograd(f"{ns}::{opname}", autograd_bwd, setup_context=setup_context)


def _reference_grads(reference: Callable, inputs: tuple, grads: tuple, n_args: int,
                     tensor_pos: list[int]) -> tuple:
    """The gradients as the torch ``reference`` gives them, with a graph of their own: a
    backward with ``create_graph=True`` (a gradient penalty, ``autograd.functional.hessian``)
    differentiates them again. The op's backward op has no autograd of its own, so its
    gradients would be constants there, and every second derivative silently zero."""
    wanted = [i for i in tensor_pos if i < len(inputs) and isinstance(inputs[i], torch.Tensor)
              and inputs[i].requires_grad]
    result: list = [None] * n_args
    out = reference(*inputs)
    outs = out if isinstance(out, (list, tuple)) else (out,)
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
    if not wanted or not pairs:
        return tuple(result)
    got = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted], [g for _, g in pairs],
                              create_graph=True, allow_unused=True)
    for i, g in zip(wanted, got):
        result[i] = g
    return tuple(result)


def _present(args: tuple, tensor_pos: list[int]) -> list[int]:
    return [i for i in tensor_pos if i < len(args) and args[i] is not None]


def _vjp_backward(op: Any, tensor_pos: list[int]) -> Callable:
    def bwd(grads, *args, **kwargs):
        jax_fn = closing_impl(op)
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

