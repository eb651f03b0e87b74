"""Rotary embeddings written by hand, rewritten to the rope kernel op (q and k at once).

    q * cos + rotate(q) * sin,  k * cos + rotate(k) * sin   ->  tpu_kernels.rope(q, k, cos, sin, interleaved)

``rotate`` is Llama's ``rotate_half`` (``cat((-x[..., d/2:], x[..., :d/2]), -1)``) or
the interleaved pairs one of GPT-J and Cohere (``stack((-x[..., 1::2], x[..., ::2]),
-1)`` flattened back to ``x``'s shape). The op takes ``q``, ``k [b, h, s, d]`` and one
``cos``, ``sin [s, d]`` (leading dims of 1 are dropped): the [b, s, h, d] layout GPT-J
and Llama's original code rotate in is left as written, since transposing around the
kernel would add two HBM passes to what XLA fuses into one.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from tpu_kernels.graph_patterns.match import ADD, MUL, NEG, arg, binary, dtype, full_slice_then, is_call, position, \
    replace, shape


def _half_rotation(node: Any) -> Any:
    """``x`` when ``node`` is cat((-x[..., h:], x[..., :h]), -1) with h = d / 2."""
    if not is_call(node, torch.cat, torch.concat) or arg(node, 1, "dim", 0) != -1:
        return None
    parts = node.args[0]
    if not isinstance(parts, (tuple, list)) or len(parts) != 2 or not is_call(parts[0], *NEG):
        return None
    hi, lo = parts[0].args[0], parts[1]
    if not (is_call(hi, operator.getitem) and is_call(lo, operator.getitem)) or hi.args[0] is not lo.args[0]:
        return None
    x = hi.args[0]
    s = shape(x)
    if s is None or not s or s[-1] % 2:
        return None
    h = s[-1] // 2
    ok = full_slice_then(hi.args[1], len(s), slice(h, None)) and full_slice_then(lo.args[1], len(s), slice(None, h))
    return x if ok else None


def _interleaved_rotation(node: Any) -> Any:
    """``x`` when ``node`` is stack((-x[..., 1::2], x[..., ::2]), -1) flattened to ``x``'s shape."""
    if is_call(node, torch.flatten, "flatten"):
        if arg(node, 1, "start_dim", 0) != -2 or arg(node, 2, "end_dim", -1) != -1:
            return None
    elif not is_call(node, "reshape", "view", torch.reshape):
        return None
    st = node.args[0]
    if not is_call(st, torch.stack) or arg(st, 1, "dim", 0) != -1 or len(st.users) != 1:
        return None
    parts = st.args[0]
    if not isinstance(parts, (tuple, list)) or len(parts) != 2 or not is_call(parts[0], *NEG):
        return None
    odd, even = parts[0].args[0], parts[1]
    if not (is_call(odd, operator.getitem) and is_call(even, operator.getitem)) or odd.args[0] is not even.args[0]:
        return None
    x = odd.args[0]
    s = shape(x)
    if s is None or not s or s[-1] % 2 or shape(node) != s:
        return None
    ok = full_slice_then(odd.args[1], len(s), slice(1, None, 2)) and \
        full_slice_then(even.args[1], len(s), slice(None, None, 2))
    return x if ok else None


def _rotated(node: Any) -> tuple[Any, Any, Any, bool] | None:
    """``(x, cos, sin, interleaved)`` when ``node`` is x * cos + rotate(x) * sin."""
    ops = binary(node, *ADD)
    if ops is None:
        return None
    for m1, m2 in (ops, ops[::-1]):
        a, b = binary(m1, *MUL), binary(m2, *MUL)
        if a is None or b is None:
            continue
        for rot, sin in (b, b[::-1]):
            x, interleaved = _half_rotation(rot), False
            if x is None:
                x, interleaved = _interleaved_rotation(rot), True
            if x is None or x not in a or dtype(node) != dtype(x):
                continue
            return x, (a[1] if a[0] is x else a[0]), sin, interleaved
    return None


def _fits(q: tuple, k: tuple) -> bool:
    """The op's layout: q, k [b, h, s, d] and cos, sin [s, d] (after leading 1s)."""
    qs, ks, cs = shape(q[0]), shape(k[0]), shape(q[1])
    if qs is None or ks is None or cs is None or len(qs) != 4 or len(ks) != 4 or shape(q[2]) != cs:
        return False
    return cs[-2:] == qs[-2:] and all(n == 1 for n in cs[:-2]) and ks[-2:] == qs[-2:]


def rope(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    """A q rotation paired with another rotation (k) that uses the same cos and sin."""
    q = _rotated(node) if node.users else None      # a node already rewritten has none
    if q is None:
        return []
    for other in node.graph.nodes:
        if other is node or not other.users:
            continue
        k = _rotated(other)
        if k is None or k[1] is not q[1] or k[2] is not q[2] or k[0] is q[0] or k[3] != q[3]:
            continue
        if not _fits(q, k):
            return []
        first, last = sorted((node, other), key=position)
        if any(position(u) < position(last) for u in first.users):
            return []              # the first rotation is used before the second exists
        d = shape(q[0])[-1]
        if not isinstance(d, int):
            return []              # a symbolic head size (dynamic shapes): left to the ops
        with graph.inserting_before(last):
            # [s, d]: the leading dims are 1s, and s may be symbolic (dynamic shapes), so
            # it is left to reshape rather than written into the graph as a raw SymInt
            cos = graph.call_method("reshape", (q[1], -1, d))
            sin = graph.call_method("reshape", (q[2], -1, d))
            both = graph.call_function(torch.ops.tpu_kernels.rope.default, (q[0], k[0], cos, sin, q[3]))
            q_out = graph.call_function(operator.getitem, (both, 0))
            k_out = graph.call_function(operator.getitem, (both, 1))
        replace(node, q_out)
        replace(other, k_out)
        return [node, other]
    return []
