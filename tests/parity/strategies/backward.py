"""Backward ops: arguments captured from CPU autograd of the forward op's drawn case; tree
helpers the parity tests share."""
from __future__ import annotations


import torch
from hypothesis import strategies as st


from strategies.base import Case, Concrete

# -- backward ops: arguments captured from CPU autograd of the forward op ---------------------------
class _Capture:
    """Records the arguments of every call of ``target`` (a TorchDispatchMode)."""

    def __init__(self, target):
        from torch.utils._python_dispatch import TorchDispatchMode
        calls = self.calls = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is target:
                    calls.append(_clone_tree((args, kwargs)))
                return func(*args, **kwargs)
        self.mode = Mode()


def _clone_tree(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_clone_tree(y) for y in x)
    if isinstance(x, dict):
        return {k: _clone_tree(v) for k, v in x.items()}
    return x


def _concrete_tree(x):
    if isinstance(x, torch.Tensor):
        return Concrete(x)
    if isinstance(x, dict):
        return {k: _concrete_tree(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_concrete_tree(y) for y in x]
    if isinstance(x, tuple):
        return tuple(_concrete_tree(y) for y in x)
    return x


def flat(x) -> list:
    """The leaves of nested lists and tuples, in order."""
    if isinstance(x, (list, tuple)):
        return [z for y in x for z in flat(y)]
    return [x]


def meta_summary(x):
    """Shapes and dtypes of a result (tensors, nested lists of them, other values' types)."""
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.dtype)
    if isinstance(x, (list, tuple)):
        return [meta_summary(y) for y in x]
    return type(x).__name__


def with_grad(args: tuple) -> tuple[tuple, list]:
    """``args`` with every float tensor (also inside lists) a fresh leaf requiring grad,
    and those leaves in order."""
    leaves = []

    def req(x):
        if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
            y = x.detach().requires_grad_()
            leaves.append(y)
            return y
        if isinstance(x, list):
            return [req(y) for y in x]
        return x
    return tuple(req(a) for a in args), leaves


def capture_backward(target, forward, forward_strategy, seed: int = 0):
    """A strategy for ``target`` (a backward op): draw a forward case, run ``forward`` and
    autograd on CPU with a random cotangent, and keep the arguments ``target`` was called
    with."""
    @st.composite
    def draw_case(draw) -> Case:
        from hypothesis import reject
        case = draw(forward_strategy)
        args, kwargs = case.build("cpu")
        args, leaves = with_grad(args)
        if not leaves:
            reject()
        cap = _Capture(target)
        try:
            with cap.mode:
                out = forward(*args, **kwargs)
                outs = [o for o in flat(out) if isinstance(o, torch.Tensor) and o.requires_grad]
                if not outs:
                    reject()
                gen = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
                cots = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) for o in outs]
                torch.autograd.grad(outs, leaves, cots, allow_unused=True)
        except Exception:
            reject()
        if not cap.calls:
            reject()
        a, k = cap.calls[0]
        return Case(_concrete_tree(a), _concrete_tree(k), grad=False)
    return draw_case()
