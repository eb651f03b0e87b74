"""Softmax-then-matmul attention written by hand, rewritten to ``F.scaled_dot_product_attention``
(which the tpu device runs as the fused flash attention op: ``runtime_ops/fused_composites.py``).

    softmax(q @ k.transpose(-2, -1) * scale [+ mask], -1) [.to(dtype)] [dropout p=0] @ v
    softmax((q @ kT * scale).masked_fill(causal, -inf), -1) @ v     ->  sdpa(q, k, v, is_causal=True)

``q``, ``k``, ``v`` are [b, h, s, d] with one dtype; ``scale`` a number (``* c`` or ``/
c``; none means 1). An additive mask of the scores' dtype that broadcasts to them
becomes ``attn_mask``. ``masked_fill`` with a boolean mask and ``-inf`` (or the dtype's
lowest value) is causal when the mask is ``triu(ones(s, s), 1)`` (or ``~tril(ones)`` /
``tril(ones) == 0``), and otherwise the additive mask ``zeros.masked_fill(mask, value)``
(the same scores: ``s + min`` rounds to ``min``). Dropout must be off (``p=0`` or
``training=False``); a softmax in float32 cast back to q's dtype is what the fused op
computes too.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from tpu_kernels.graph_patterns.match import ADD, DIV, MATMUL, MUL, arg, binary, dtype, is_call, is_last_dim, \
    only_user, replace, shape

_CASTS = ("to", "type", "type_as", "float", "half", "bfloat16", "contiguous")
_TRANSPOSED = {(-2, -1), (-1, -2), (2, 3), (3, 2)}


def _through_casts(node: Any, user: fx.Node) -> Any:
    """The node under a chain of single-user casts ending at ``user``'s input ``node``."""
    while is_call(node, *_CASTS) and only_user(node, user):
        user, node = node, node.args[0]
    return node if only_user(node, user) else None


def _dropout_off(node: Any) -> bool:
    if is_call(node, F.dropout, torch.dropout, "dropout"):
        p, training = arg(node, 1, "p", 0.5), arg(node, 2, "training", True)
        return p == 0 or training is False
    return False


def _probabilities(node: Any, user: fx.Node) -> Any:
    """The scores ``s`` when ``node`` is softmax(s, -1) under casts and an off dropout."""
    node = _through_casts(node, user)
    if _dropout_off(node) and not (node.target is F.dropout and arg(node, 3, "inplace", False)):
        user, node = node, _through_casts(node.args[0], node)
    if not is_call(node, F.softmax, torch.softmax, "softmax"):
        return None
    if arg(node, 3 if node.target is F.softmax else 2, "dtype") not in (None, torch.float32):
        return None
    s = node.args[0]
    return s if only_user(s, node) and is_last_dim(s, arg(node, 1, "dim")) else None


def _keys(kt: Any) -> Any:
    """``k`` when ``kt`` is k transposed in its last two dims (4-D)."""
    if is_call(kt, "transpose", torch.transpose) and tuple(kt.args[1:3]) in _TRANSPOSED:
        return kt.args[0]
    if is_call(kt, "permute", torch.permute) and tuple(kt.args[1:]) in ((0, 1, 3, 2), ((0, 1, 3, 2),)):
        return kt.args[0]
    return None


def _scaled_scores(node: Any) -> tuple[Any, Any, float] | None:
    """``(q, k, scale)`` when ``node`` is q @ kT, times or over a number."""
    scale = 1.0
    mul, div = binary(node, *MUL), binary(node, *DIV)
    if mul is not None:
        mm, c = mul if isinstance(mul[1], (int, float)) else mul[::-1]
        scale = c
    elif div is not None:
        mm, c = div
        scale = 1.0 / c if isinstance(c, (int, float)) and c else None
    else:
        mm, c = node, 1.0
    if not isinstance(c, (int, float)) or scale is None or not math.isfinite(scale):
        return None
    if mm is not node and not only_user(mm, node):
        return None
    qk = binary(mm, *MATMUL)
    k = _keys(qk[1]) if qk is not None and only_user(qk[1], mm) else None
    return (qk[0], k, float(scale)) if k is not None else None


def _ones(node: Any) -> bool:
    while is_call(node, "bool", "to"):
        node = node.args[0]
    return is_call(node, torch.ones, torch.ones_like)


def _causal(mask: Any) -> bool:
    """``mask`` is True above the diagonal: triu(ones, 1), ~tril(ones), tril(ones) == 0."""
    while is_call(mask, "bool") or is_call(mask, "to") and arg(mask, 1, "dtype") is torch.bool:
        mask = mask.args[0]
    if is_call(mask, torch.triu, "triu"):
        return arg(mask, 1, "diagonal", 0) == 1 and _ones(mask.args[0])
    if is_call(mask, operator.invert, torch.logical_not, "logical_not", "bitwise_not"):
        inner = mask.args[0]
    elif is_call(mask, operator.eq, torch.eq, "eq") and mask.args[1] == 0:
        inner = mask.args[0]
    else:
        return False
    return is_call(inner, torch.tril, "tril") and arg(inner, 1, "diagonal", 0) == 0 and _ones(inner.args[0])


def _broadcasts(mask: Any, scores: Any) -> bool:
    m, s = shape(mask), shape(scores)
    return m is not None and s is not None and len(m) <= len(s) and all(
        a in (1, b) for a, b in zip(m[::-1], s[::-1]))


def _masked(node: Any, q_dtype: torch.dtype) -> tuple[Any, Any, bool] | None:
    """``(scores, mask, causal)``: the scores before an additive mask or a masked_fill, if any."""
    add = binary(node, *ADD)
    if add is not None:
        for s, m in (add, add[::-1]):
            if isinstance(m, fx.Node) and shape(s) == shape(node) and dtype(m) == q_dtype and _broadcasts(m, s) \
                    and only_user(s, node):
                return s, m, False
        return None
    if is_call(node, torch.masked_fill, "masked_fill"):
        s, m, fill = node.args[0], arg(node, 1, "mask"), arg(node, 2, "value")
        lowest = fill == -math.inf or fill == torch.finfo(q_dtype).min
        if not (isinstance(fill, float) and lowest and dtype(m) == torch.bool and _broadcasts(m, s)
                and only_user(s, node)):
            return None
        if _causal(m) and shape(m)[-2:] == shape(s)[-2:] and shape(s)[-2] == shape(s)[-1]:
            return s, None, True
        return s, (m, fill), False
    return node, None, False


def attention(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    pv = binary(node, *MATMUL)
    if pv is None or shape(node) is None or len(shape(node)) != 4:
        return []
    p, v = pv
    s = _probabilities(p, node)
    q_dtype = dtype(node)
    masked = _masked(s, q_dtype) if s is not None else None
    found = _scaled_scores(masked[0]) if masked is not None else None
    if found is None:
        return []
    q, k, scale = found
    if any(shape(t) is None or len(shape(t)) != 4 or dtype(t) != q_dtype or shape(t)[:2] != shape(q)[:2]
           for t in (q, k, v)):
        return []              # one batch and head count (a broadcasting matmul is not sdpa's)
    mask, causal = masked[1], masked[2]
    with graph.inserting_before(node):
        if isinstance(mask, tuple):        # a boolean mask filled with the lowest value: additive
            zeros = graph.call_function(torch.zeros_like, (mask[0],), {"dtype": q_dtype})
            mask = graph.call_method("masked_fill", (zeros, mask[0], mask[1]))
        out = graph.call_function(F.scaled_dot_product_attention, (q, k, v),
                                  {"attn_mask": mask, "dropout_p": 0.0, "is_causal": causal, "scale": scale})
    replace(node, out)
    return [node]
