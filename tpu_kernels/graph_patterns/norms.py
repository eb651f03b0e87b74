"""RMSNorm and LayerNorm written by hand, rewritten to the fused norm ops.

    x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)   ->  aten._fused_rms_norm(x, [d], None, eps)[0]
    (x - mean) / sqrt(var + eps) [* w + b]              ->  aten.native_layer_norm(x, [d], w, b, eps)[0]

RMSNorm is matched in the Hugging Face spellings (``pow(2)``, ``x * x`` or ``square``;
``rsqrt`` or ``1 / sqrt``); the weight's multiply stays as written (Gemma's ``(1 + w)``
too), as does a float32 upcast around it. LayerNorm: ``mean = x.mean(-1, keepdim=True)``,
the biased variance (``((x - mean) ** 2).mean(-1, keepdim=True)``, or ``x.var(-1,
keepdim=True, unbiased=False)`` / ``correction=0``), ``/ sqrt(var + eps)`` or ``*
rsqrt(var + eps)``; a ``[d]`` weight multiplied (and a ``[d]`` bias added) straight
after the normalisation join the op, anything else (a cast first) stays as written.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from tpu_kernels.graph_patterns.match import (ADD, DIV, MUL, RSQRT, SQRT, SUB, arg, binary, dtype, is_call,
                                              is_last_dim, only_user, replace, shape)

MEAN = (torch.mean, "mean")


def _keepdim_last(node: Any, fn: tuple) -> Any:
    """``x`` when ``node`` is ``fn(x, -1, keepdim=True)`` (a last-dim reduction)."""
    if not is_call(node, *fn) or arg(node, 2, "keepdim", False) is not True:
        return None
    x = node.args[0]
    return x if is_last_dim(x, arg(node, 1, "dim")) else None


def _square_of(sq: Any) -> Any:
    if is_call(sq, torch.pow, operator.pow, "pow") and arg(sq, 1, "exponent") == 2:
        return sq.args[0]
    if is_call(sq, torch.square, "square"):
        return sq.args[0]
    if is_call(sq, *MUL) and len(sq.args) == 2 and sq.args[0] is sq.args[1]:
        return sq.args[0]
    return None


def _plus_eps(node: Any) -> tuple[Any, float] | None:
    """``(v, eps)`` when ``node`` is ``v + eps`` with a float ``eps``."""
    ops = binary(node, *ADD)
    if ops is None or not isinstance(ops[1], float):
        return None
    return ops


def _inverse_sqrt(node: Any, user: fx.Node) -> tuple[Any, float] | None:
    """``(v, eps)`` when ``node``, read by ``user`` alone, is rsqrt(v + eps) or 1 / sqrt(v + eps)."""
    if not only_user(node, user):
        return None
    if is_call(node, *RSQRT):
        inner, reader = node.args[0], node
    else:
        ops = binary(node, *DIV)
        if ops is None or isinstance(ops[0], fx.Node) or ops[0] != 1 or not is_call(ops[1], *SQRT) \
                or not only_user(ops[1], node):
            return None
        inner, reader = ops[1].args[0], ops[1]
    return _plus_eps(inner) if only_user(inner, reader) else None


# -- RMSNorm ------------------------------------------------------------------------------

def _inv_rms(node: Any, user: fx.Node) -> tuple[Any, float] | None:
    """``(x, eps)`` when ``node`` is rsqrt(mean(x^2, -1, keepdim=True) + eps) or 1 / sqrt(...)."""
    found = _inverse_sqrt(node, user)
    if found is None:
        return None
    ms, eps = found
    sq = ms.args[0] if is_call(ms, *MEAN) else None
    if not only_user(sq, ms) or _keepdim_last(ms, MEAN) is None:
        return None
    x = _square_of(sq)
    return (x, eps) if x is not None else None


def rms_norm(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    ops = binary(node, *MUL)
    if ops is None:
        return []
    for x, inv in (ops, ops[::-1]):
        found = _inv_rms(inv, node)
        if found is None or found[0] is not x or not shape(x):
            continue
        with graph.inserting_before(node):
            fused = graph.call_function(torch.ops.aten._fused_rms_norm.default, (x, [shape(x)[-1]], None, found[1]))
            out = graph.call_function(operator.getitem, (fused, 0))
        replace(node, out)
        return [node]
    return []


# -- LayerNorm ----------------------------------------------------------------------------

def _centred(node: Any) -> Any:
    """``x`` when ``node`` is ``x - x.mean(-1, keepdim=True)``."""
    ops = binary(node, *SUB)
    if ops is None:
        return None
    x, mean = ops
    return x if _keepdim_last(mean, MEAN) is x else None


def _biased_var_of(node: Any) -> Any:
    """``x`` when ``node`` is the biased variance of ``x`` over the last dim, kept."""
    if is_call(node, torch.var, "var"):
        unbiased, correction = arg(node, 2, "unbiased"), node.kwargs.get("correction")
        biased = unbiased is False or (unbiased is None and correction in (0, 0.0))
        if not biased or arg(node, 3, "keepdim", False) is not True:
            return None
        return node.args[0] if is_last_dim(node.args[0], arg(node, 1, "dim")) else None
    sq = node.args[0] if is_call(node, *MEAN) else None
    if not only_user(sq, node) or _keepdim_last(node, MEAN) is None:
        return None
    return _centred(_square_of(sq))


def _normalised(node: fx.Node) -> tuple[Any, float] | None:
    """``(x, eps)`` when ``node`` is (x - mean) / sqrt(var + eps) or (x - mean) * rsqrt(var + eps)."""
    div = binary(node, *DIV)
    if div is not None:
        candidates = [(div[0], div[1], SQRT)]
    else:
        mul = binary(node, *MUL)
        candidates = [] if mul is None else [(mul[0], mul[1], RSQRT), (mul[1], mul[0], RSQRT)]
    for xc, den, fn in candidates:
        x = _centred(xc)
        if x is None or not is_call(den, *fn) or not only_user(den, node):
            continue
        found = _plus_eps(den.args[0])
        if found is not None and _biased_var_of(found[0]) is x:
            return x, found[1]
    return None


def _affine(node: fx.Node, d: int, ops: tuple) -> tuple[fx.Node, Any] | None:
    """``(user, param)`` when ``node``'s only user multiplies/adds it by a ``[d]`` parameter."""
    users = list(node.users)
    if len(users) != 1:
        return None
    ab = binary(users[0], *ops)
    if ab is None:
        return None
    other = ab[1] if ab[0] is node else ab[0]
    ok = other is not node and shape(other) == (d,) and dtype(other) == dtype(node)
    return (users[0], other) if ok else None


def layer_norm(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    found = _normalised(node) if node.users else None
    if found is None:
        return []
    x, eps = found
    d = shape(x)[-1]
    end, weight, bias = node, None, None
    scaled = _affine(node, d, MUL)
    if scaled is not None:
        end, weight = scaled
        shifted = _affine(end, d, ADD)
        if shifted is not None:
            end, bias = shifted
    with graph.inserting_before(end):
        fused = graph.call_function(torch.ops.aten.native_layer_norm.default, (x, [d], weight, bias, eps))
        out = graph.call_function(operator.getitem, (fused, 0))
    replace(end, out)
    return [end]
