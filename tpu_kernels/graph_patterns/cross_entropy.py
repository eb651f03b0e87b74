"""A linear layer followed by cross entropy, rewritten to the fused linear cross entropy op
(whose Pallas kernel never materialises the logits).

    F.cross_entropy(F.linear(h, W)[...].view(-1, V), target, ...)  ->  tpu_kernels.linear_cross_entropy(
                                                                        h[...].reshape(-1, H), W, target, ...)

The logits are ``F.linear(h, W)`` (no bias) or ``h @ W.T`` (``W.t()``, ``W.transpose(0,
1)``) with ``W [V, H]``; between them and the loss only row selections (``logits[...,
:-1, :]``, which select the same rows of ``h``), ``contiguous``, reshapes to ``[n, V]``
and casts that keep the dtype. A cast that changes it (``logits.float()`` of bf16
logits) is left as written: the fused op's loss has the hidden states' dtype. Class
weights, and the deprecated ``size_average`` / ``reduce``, are left as written too.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from tpu_kernels.graph_patterns.match import MATMUL, arg, binary, dtype, is_call, only_user, replace, shape

_RESHAPES = ("reshape", "view", "flatten", torch.reshape, torch.flatten)
_SAME_DTYPE = ("contiguous", "to", "type", "float", "half", "bfloat16")


def _weight(node: Any) -> Any:
    """``W`` when ``node`` is W transposed (a 2-D ``W.T``, ``W.t()`` or ``W.transpose(0, 1)``)."""
    if is_call(node, "t", torch.t) or (is_call(node, "transpose", torch.transpose) and
                                        tuple(node.args[1:3]) in ((0, 1), (1, 0), (-1, -2), (-2, -1))):
        w = node.args[0]
    elif node is not None and node.op == "call_function" and node.target is getattr and node.args[1] == "T":
        w = node.args[0]
    else:
        return None
    return w if shape(w) is not None and len(shape(w)) == 2 else None


def _linear(node: Any) -> tuple[Any, Any] | None:
    """``(h, W)`` when ``node`` is F.linear(h, W) or h @ W.T."""
    if is_call(node, F.linear):
        if arg(node, 2, "bias") is not None:
            return None
        h, w = node.args[0], arg(node, 1, "weight")
        return (h, w) if shape(w) is not None and len(shape(w)) == 2 else None
    mm = binary(node, *MATMUL)
    w = _weight(mm[1]) if mm is not None and only_user(mm[1], node) else None
    return (mm[0], w) if w is not None else None


def _selects_rows(index: Any, rank: tuple | None) -> bool:
    """``index`` slices leading dims and keeps the last (``x[..., :-1, :]``)."""
    if not isinstance(index, tuple) or not index or index[-1] != slice(None) or rank is None:
        return False
    if not all(i is Ellipsis or isinstance(i, slice) for i in index):
        return False
    return Ellipsis in index or len(index) == len(rank)


def _logits(node: Any, user: fx.Node) -> tuple[Any, Any, list] | None:
    """``(h, W, row selections)`` when ``node`` is linear(h, W) under the steps above."""
    picks: list = []
    while only_user(node, user):
        found = _linear(node)
        if found is not None:
            return found[0], found[1], picks[::-1]
        if is_call(node, *_SAME_DTYPE) and dtype(node) == dtype(node.args[0]):
            pass
        elif is_call(node, *_RESHAPES) and not picks:     # reshapes only after the row selections
            pass
        elif is_call(node, operator.getitem) and _selects_rows(node.args[1], shape(node.args[0])):
            picks.append(node.args[1])
        else:
            return None
        user, node = node, node.args[0]
    return None


def linear_cross_entropy(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    if not is_call(node, F.cross_entropy) or any(arg(node, i, n) is not None for i, n in
                                                 ((2, "weight"), (3, "size_average"), (5, "reduce"))):
        return []
    logits, target = node.args[0], arg(node, 1, "target")
    ls, ts = shape(logits), shape(target)
    found = _logits(logits, node) if ls is not None and ts is not None and len(ls) == 2 and ts == ls[:1] else None
    if found is None or dtype(target) not in (torch.int64, torch.int32):
        return []
    h, w, picks = found
    if dtype(h) != dtype(w) or dtype(h) != dtype(logits) or shape(w)[0] != ls[1]:
        return []
    with graph.inserting_before(node):
        for index in picks:
            h = graph.call_function(operator.getitem, (h, index))
        rows = graph.call_method("reshape", (h, -1, shape(w)[1]))
        out = graph.call_function(torch.ops.tpu_kernels.linear_cross_entropy.default, (
            rows, w, target, arg(node, 4, "ignore_index", -100), arg(node, 6, "reduction", "mean"),
            arg(node, 7, "label_smoothing", 0.0)))
    replace(node, out)
    return [node]
