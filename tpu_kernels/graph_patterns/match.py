"""Matching helpers for the graph pattern rules: what a Dynamo graph node calls, its
arguments, its users and its example value's shape and dtype."""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

MUL = (operator.mul, torch.mul, "mul")
ADD = (operator.add, torch.add, "add")
SUB = (operator.sub, torch.sub, "sub")
DIV = (operator.truediv, torch.div, "div")
NEG = (operator.neg, torch.neg, "neg")
MATMUL = (operator.matmul, torch.matmul, "matmul", torch.bmm, "bmm")
SQRT = (torch.sqrt, "sqrt")
RSQRT = (torch.rsqrt, "rsqrt")


def is_call(node: Any, *targets: Any) -> bool:
    """``node`` calls one of ``targets`` (functions, or method names as strings)."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_function":
        return node.target in targets
    return node.op == "call_method" and node.target in targets


def arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    """Argument ``i`` (positional) or ``name`` (keyword) of ``node``'s call."""
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def only_user(node: Any, user: fx.Node) -> bool:
    """``node`` is a graph value that ``user`` alone reads."""
    return isinstance(node, fx.Node) and list(node.users) == [user]


def value(node: Any) -> torch.Tensor | None:
    """The fake tensor Dynamo recorded for ``node`` (None for anything else)."""
    val = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def shape(node: Any) -> tuple | None:
    val = value(node)
    return tuple(val.shape) if val is not None else None


def dtype(node: Any) -> torch.dtype | None:
    val = value(node)
    return val.dtype if val is not None else None


def operands(node: fx.Node) -> tuple[Any, Any]:
    """The two operands of a binary call (``a * b``, ``torch.mul(a, b)``, ``a.mul(b)``)."""
    return arg(node, 0, "input"), arg(node, 1, "other")


def binary(node: Any, *targets: Any) -> tuple[Any, Any] | None:
    """The operands of ``node`` when it is a plain binary call to one of ``targets``."""
    if not is_call(node, *targets) or len(node.args) != 2 or node.kwargs:
        return None
    return node.args[0], node.args[1]


def is_last_dim(node: Any, dim: Any) -> bool:
    """``dim`` (an int or a one-element list) names the last dim of ``node``'s value."""
    if isinstance(dim, (tuple, list)):
        if len(dim) != 1:
            return False
        dim = dim[0]
    s = shape(node)
    return isinstance(dim, int) and s is not None and len(s) > 0 and dim in (-1, len(s) - 1)


def position(node: fx.Node) -> int:
    return next(i for i, n in enumerate(node.graph.nodes) if n is node)


def replace(node: fx.Node, new: fx.Node) -> None:
    """Send ``node``'s users to ``new``, which computes the same value (its example value
    goes with it, for the rules that run later)."""
    if "example_value" in node.meta:
        new.meta["example_value"] = node.meta["example_value"]
    node.replace_all_uses_with(new)


def full_slice_then(index: Any, rank: int, last: Any) -> bool:
    """``index`` is ``x[..., last]`` spelled ``(Ellipsis, last)`` or with ``rank - 1`` full slices first."""
    if not isinstance(index, tuple) or not index or index[-1] != last:
        return False
    head = index[:-1]
    return head == (Ellipsis,) or (len(head) == rank - 1 and all(h == slice(None) for h in head))


# ops whose result shares its input's memory (method names or functions), and the Python
# operators that write into their first argument (``o += c``, ``o[:, 0] = 0``)
_VIEWS = ("view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "flatten",
          "unflatten", "narrow", "select", "t", "contiguous", "as_strided", "view_as", "unbind",
          "split", "chunk", "movedim", "swapaxes", "diagonal", operator.getitem, torch.transpose,
          torch.permute, torch.reshape, torch.flatten, torch.narrow, torch.select, torch.squeeze,
          torch.unsqueeze, torch.movedim, torch.split, torch.chunk, torch.unbind, torch.t,
          torch.swapaxes, torch.diagonal)
_WRITES = (operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
           operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
           operator.ilshift, operator.irshift, operator.setitem)


def written_later(node: fx.Node) -> bool:
    """Whether a later op writes into ``node``'s value or a view of it: an in-place method
    or function (``add_``, ``relu(inplace=True)``), an augmented assignment, an item
    assignment or an ``out=``. A fused op whose derivative saves its output (flash
    attention) must not replace such a node: autograd would find the output changed."""
    seen, stack = {node}, [node]
    while stack:
        n = stack.pop()
        for user in n.users:
            first = user.args[0] if user.args else None
            if first is n and (in_place(user) or user.target in _WRITES or user.kwargs.get("inplace") is True):
                return True
            if user.kwargs.get("out") is n:
                return True
            if first is n and is_call(user, *_VIEWS) and user not in seen:
                seen.add(user)
                stack.append(user)
    return False


def in_place(node: fx.Node) -> bool:
    """``node`` calls an in-place method or function (its name ends in one ``_``)."""
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")
