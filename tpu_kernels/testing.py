"""Parity checking: the same call on CPU torch and on the tpu device, compared.

``check(fn, *cpu_args)`` runs any torch code both ways. ``check_parity(op, ...)`` checks
every tpu impl of an op (each forced in turn) against its CPU reference: the op itself
for ATen ops, the ``reference=`` given to ``@tpu_kernel`` for custom ops. Use it in your
own test suite:

    from tpu_kernels.testing import check_parity
    def test_my_op():
        check_parity("mylib::fused_rms_norm", (torch.randn(4, 64), torch.randn(64), 1e-6))
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch.utils._pytree import tree_map

# (atol, rtol) per dtype: torch.testing's defaults, which follow each dtype's precision
# (eps: f32 1.2e-7, bf16 7.8e-3, f16 9.8e-4). Integers and bool compare exactly.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1.3e-6),
    torch.float64: (1e-7, 1e-7),
    torch.bfloat16: (1e-5, 1.6e-2),
    torch.float16: (1e-5, 1e-3),
    torch.complex64: (1e-5, 1.3e-6),
    torch.complex128: (1e-7, 1e-7),
}


def tol(dtype: torch.dtype) -> dict[str, float]:
    atol, rtol = TOLERANCES.get(dtype, (0.0, 0.0))
    return {"atol": atol, "rtol": rtol}


def to_tpu(x: Any) -> Any:
    def conv(t):
        if isinstance(t, torch.Tensor):
            out = t.detach().to("tpu")
            return out.requires_grad_(t.requires_grad) if t.is_leaf and t.requires_grad else out
        return t
    return tree_map(conv, x)


def to_cpu(x: Any) -> Any:
    return tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, x)


def assert_same(expected: Any, actual: Any, msg: str = "", **tolerance: float) -> None:
    """Values, shapes and dtypes equal within the dtype's tolerance (or ``tolerance``)."""
    e_leaves = [e for e in _leaves(expected)]
    a_leaves = [a for a in _leaves(actual)]
    assert len(e_leaves) == len(a_leaves), f"{msg}: {len(a_leaves)} outputs, expected {len(e_leaves)}"
    for e, a in zip(e_leaves, a_leaves):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"{msg}: got {type(a)}, expected a tensor"
            a = a.cpu()
            kw = tolerance or tol(e.dtype)
            torch.testing.assert_close(a, e, equal_nan=True, msg=lambda m: f"{msg}\n{m}", **kw)
        else:
            assert a == e or (a != a and e != e), f"{msg}: {a!r} != {e!r}"


def _leaves(x: Any) -> list:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _leaves(v)]
    return [x]


def check(fn: Callable[..., Any], *args: Any, grad: bool = False, msg: str = "", **tolerance: float) -> Any:
    """``fn(*args)`` on CPU and on tpu give the same result (and gradients, if ``grad``)."""
    expected = fn(*args)
    targs = to_tpu(args)
    actual = fn(*targs)
    assert_same(expected, actual, msg or getattr(fn, "__name__", "fn"), **tolerance)
    if grad:
        _check_grads(expected, actual, args, targs, msg, **tolerance)
    return actual


def _check_grads(expected, actual, args, targs, msg, **tolerance):
    ins = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    tins = [a for a in targs if isinstance(a, torch.Tensor) and a.requires_grad]
    outs = [e for e in _leaves(expected) if isinstance(e, torch.Tensor) and e.requires_grad]
    touts = [a for a in _leaves(actual) if isinstance(a, torch.Tensor) and a.requires_grad]
    gen = torch.Generator().manual_seed(0)
    cots = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
    ge = torch.autograd.grad(outs, ins, cots, allow_unused=True)
    ga = torch.autograd.grad(touts, tins, [to_tpu(c) for c in cots], allow_unused=True)
    assert_same(list(ge), [g if g is not None else None for g in ga], f"{msg} (grad)", **tolerance)


def reference_of(op: Any) -> Callable[..., Any]:
    """The CPU reference of ``op``: a custom op's ``reference=``, else the op itself."""
    from tpu_kernels.registry import resolve_overload
    from tpu_kernels.registry.custom_op import DEFINED
    overload = resolve_overload(getattr(op, "op", op))
    qual = overload._schema.name
    if qual in DEFINED:
        ref = DEFINED[qual].reference
        if ref is None:
            raise ValueError(f"{qual} has no reference=...; check_parity needs one")
        return ref
    return overload


def check_parity(op: Any, *examples: tuple, strategy: Any = None, max_examples: int = 10,
                 grad: bool = False, **tolerance: float) -> int:
    """Every tpu impl of ``op`` that accepts an example matches the CPU reference.

    ``examples`` are argument tuples of CPU tensors and Python values; ``strategy`` is a
    Hypothesis strategy drawing such tuples. Returns the number of (example, impl) pairs
    checked; raises AssertionError with a reproducer on the first mismatch.
    """
    from tpu_kernels import registry
    overload = registry.resolve_overload(getattr(op, "op", op))
    ref = reference_of(op)
    checked = 0

    def one(args: tuple) -> None:
        nonlocal checked
        expected = ref(*args)
        for impl in registry.impls(overload):
            meta = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, args)
            if impl.check(*meta) is not None:
                continue
            with registry.force(impl):
                actual = overload(*to_tpu(args))
            assert_same(expected, actual, f"{overload} impl {impl.kind}:{impl.name}\n"
                        f"reproduce: {reproducer(overload, args)}", **tolerance)
            checked += 1
    for ex in examples:
        one(tuple(ex))
    if strategy is not None:
        from hypothesis import given, settings
        settings(max_examples=max_examples, deadline=None)(given(strategy)(lambda ex: one(tuple(ex))))()
    return checked


def reproducer(op: Any, args: Iterable[Any]) -> str:
    """A few lines of Python that rebuild ``args`` exactly and call ``op`` on tpu."""
    lines = ["import torch, tpu_kernels"]
    names = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            lines.append(f"a{i} = torch.tensor({a.tolist()!r}, dtype={a.dtype}).to('tpu')")
            names.append(f"a{i}")
        else:
            names.append(repr(a))
    lines.append(f"print(torch.ops.{str(op)}({', '.join(names)}))")
    return "\n".join(lines)
