"""Hand-written model code rewritten to the kernel ops, in ``torch.compile(backend="tpu")``
graphs: an FX pass over Dynamo's graph, before AOTAutograd (so the fused ops' own
derivatives make the backward graph).

    x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)   ->  aten._fused_rms_norm(x, [d], None, eps)[0]
    x * cos + cat((-x[..., d/2:], x[..., :d/2]), -1) * sin   (for q and k with one cos, sin)
                                                         ->  tpu_kernels.rope(q, k, cos, sin)
    silu(a) * b                                          ->  tpu_kernels.swiglu(a, b)
    gelu(a, approximate=...) * b                         ->  tpu_kernels.geglu(a, b, approximate)

RMSNorm is matched in the Hugging Face spellings (``pow(2)``, ``x * x`` or ``square``;
``rsqrt`` or ``1 / sqrt``; with or without the float32 upcast around it, which stays as
written, as does the weight's multiply: Gemma's ``(1 + w)`` too). Each rewrite keeps the
graph's values: the replaced nodes have no other users, and the ops compute what the
pattern computes. Only the nodes a rewrite left unused are erased (FX's own dead-code pass
counts every ``call_method`` as pure, so it would drop the in-place ``index_copy_`` of a
static KV cache, whose result nobody reads). ``REWRITES`` counts what was rewritten in
this process. The pass is on by default; ``TPU_KERNELS_GRAPH_PATTERNS=0`` turns it off.
"""
from __future__ import annotations

import collections
import operator
import os
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import fx

REWRITES: collections.Counter = collections.Counter()


def rewrite(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite the patterns above in ``gm`` (in place) and return it."""
    if not enabled():
        return gm
    replaced: list[fx.Node] = []
    for name, rule in _RULES:
        for node in list(gm.graph.nodes):
            done = rule(gm.graph, node)
            if done:
                REWRITES[name] += 1
                replaced.extend(done)
    if replaced:
        for node in replaced:
            _erase_unused(gm.graph, node)
        gm.recompile()
    return gm


def enabled() -> bool:
    """The pass runs unless ``TPU_KERNELS_GRAPH_PATTERNS`` is ``0`` (or empty)."""
    return os.environ.get("TPU_KERNELS_GRAPH_PATTERNS", "1") not in ("", "0")


def _erase_unused(graph: fx.Graph, node: fx.Node) -> None:
    """Erase ``node`` and the inputs it alone used, back to anything impure or in place."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.users or n.op not in ("call_function", "call_method") or n.is_impure() or _in_place(n):
            continue
        inputs = n.all_input_nodes
        graph.erase_node(n)
        stack.extend(i for i in inputs if i not in stack)


def _in_place(node: fx.Node) -> bool:
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


# -- matching helpers ------------------------------------------------------------------------

def _is(node: Any, *targets: Any) -> bool:
    """``node`` calls one of ``targets`` (functions, or method names as strings)."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_function":
        return node.target in targets
    return node.op == "call_method" and node.target in targets


def _arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _only_user(node: Any, user: fx.Node) -> bool:
    return isinstance(node, fx.Node) and list(node.users) == [user]


def _shape(node: Any) -> tuple | None:
    val = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _operands(node: fx.Node) -> tuple[Any, Any]:
    return _arg(node, 0, "input"), _arg(node, 1, "other")


_MUL = (operator.mul, torch.mul, "mul")
_ADD = (operator.add, torch.add, "add")


# -- RMSNorm ------------------------------------------------------------------------------

def _mean_square_of(node: Any) -> Any:
    """``x`` when ``node`` is mean(x^2, -1, keepdim=True), else None."""
    if not _is(node, torch.mean, "mean") or _arg(node, 2, "keepdim", False) is not True:
        return None
    dim = _arg(node, 1, "dim")
    if dim not in (-1, (-1,), [-1]):
        return None
    sq = node.args[0]
    if not _only_user(sq, node):
        return None
    if _is(sq, torch.pow, operator.pow, "pow") and _arg(sq, 1, "exponent") == 2:
        return sq.args[0]
    if _is(sq, torch.square, "square"):
        return sq.args[0]
    if _is(sq, *_MUL) and sq.args[0] is sq.args[1]:
        return sq.args[0]
    return None


def _inv_rms(node: Any) -> tuple[Any, float] | None:
    """``(x, eps)`` when ``node`` is rsqrt(mean(x^2) + eps) or 1 / sqrt(...)."""
    if _is(node, torch.rsqrt, "rsqrt"):
        inner = node.args[0]
    elif _is(node, operator.truediv, torch.div, "div") and node.args[0] == 1 and _is(node.args[1], torch.sqrt, "sqrt"):
        inner = node.args[1].args[0]
    else:
        return None
    if not _is(inner, *_ADD) or not isinstance(inner.args[1], float) or _arg(inner, 2, "alpha", 1) != 1:
        return None
    x = _mean_square_of(inner.args[0])
    return (x, inner.args[1]) if x is not None else None


def _rms_norm(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    if not _is(node, *_MUL) or node.kwargs:
        return []
    a, b = _operands(node)
    for x, inv in ((a, b), (b, a)):
        found = _inv_rms(inv) if _only_user(inv, node) else None
        if found is None or found[0] is not x:
            continue
        shape = _shape(x)
        if shape is None or not shape:
            return []
        with graph.inserting_before(node):
            fused = graph.call_function(torch.ops.aten._fused_rms_norm.default, (x, [shape[-1]], None, found[1]))
            out = graph.call_function(operator.getitem, (fused, 0))
        node.replace_all_uses_with(out)
        return [node]
    return []


# -- gated linear units -------------------------------------------------------------------

def _glu(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    if not _is(node, *_MUL) or node.kwargs:
        return []
    a, b = _operands(node)
    for act, up in ((a, b), (b, a)):
        if not _only_user(act, node) or not isinstance(up, fx.Node) or _shape(act) != _shape(up) or _shape(up) is None:
            continue
        if _is(act, F.silu, torch.nn.functional.silu, "silu") and not _arg(act, 1, "inplace", False):
            call: tuple[Callable, tuple] = (torch.ops.tpu_kernels.swiglu.default, (act.args[0], up))
        elif _is(act, F.gelu, "gelu"):
            call = (torch.ops.tpu_kernels.geglu.default, (act.args[0], up, _arg(act, 1, "approximate", "none")))
        else:
            continue
        with graph.inserting_before(node):
            out = graph.call_function(*call)
        node.replace_all_uses_with(out)
        return [node]
    return []


# -- rotary embeddings (rotate_half) -------------------------------------------------------

def _rotate_half_of(node: Any) -> Any:
    """``x`` when ``node`` is cat((-x[..., h:], x[..., :h]), -1) with h = d / 2."""
    if not _is(node, torch.cat, torch.concat) or _arg(node, 1, "dim", 0) != -1:
        return None
    parts = node.args[0]
    if not isinstance(parts, (tuple, list)) or len(parts) != 2 or not _is(parts[0], operator.neg, torch.neg, "neg"):
        return None
    hi, lo = parts[0].args[0], parts[1]
    if not (_is(hi, operator.getitem) and _is(lo, operator.getitem)) or hi.args[0] is not lo.args[0]:
        return None
    x = hi.args[0]
    shape = _shape(x)
    if shape is None or shape[-1] % 2:
        h = None
    else:
        h = shape[-1] // 2
    if hi.args[1] != (Ellipsis, slice(h, None, None)) or lo.args[1] != (Ellipsis, slice(None, h, None)):
        return None
    return x


def _rope_half(node: Any) -> tuple[Any, Any, Any] | None:
    """``(x, cos, sin)`` when ``node`` is x * cos + rotate_half(x) * sin."""
    if not _is(node, *_ADD) or node.kwargs or len(node.args) != 2:
        return None
    m1, m2 = node.args
    if not (_is(m1, *_MUL) and _is(m2, *_MUL)):
        return None
    x, cos = m1.args
    rot, sin = m2.args
    if _rotate_half_of(rot) is not x:
        return None
    return x, cos, sin


def _rope(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    """A q rotation paired with the next k rotation that uses the same cos and sin."""
    q = _rope_half(node) if node.users else None      # a node already rewritten has none
    if q is None:
        return []
    for other in node.graph.nodes:
        if other is node or not other.users:
            continue
        k = _rope_half(other)
        if k is None or k[1] is not q[1] or k[2] is not q[2] or k[0] is q[0]:
            continue
        qs, ks, cs = _shape(q[0]), _shape(k[0]), _shape(q[1])
        if qs is None or ks is None or cs is None or len(qs) != 4 or len(ks) != 4 or _shape(q[2]) != cs:
            return []
        s, d = qs[-2], qs[-1]
        if cs[-2:] != (s, d) or any(n != 1 for n in cs[:-2]) or ks[-2:] != (s, d):
            return []
        first, last = sorted((node, other), key=_position)
        if any(_position(u) < _position(last) for u in first.users):
            return []              # the first rotation is used before the second exists
        with graph.inserting_before(last):
            cos = graph.call_method("reshape", (q[1], s, d))
            sin = graph.call_method("reshape", (q[2], s, d))
            both = graph.call_function(torch.ops.tpu_kernels.rope.default, (q[0], k[0], cos, sin))
            q_out = graph.call_function(operator.getitem, (both, 0))
            k_out = graph.call_function(operator.getitem, (both, 1))
        node.replace_all_uses_with(q_out)
        other.replace_all_uses_with(k_out)
        return [node, other]
    return []


def _position(node: fx.Node) -> int:
    return next(i for i, n in enumerate(node.graph.nodes) if n is node)


_RULES: tuple[tuple[str, Callable[[fx.Graph, fx.Node], list[fx.Node]]], ...] = (
    ("rms_norm", _rms_norm), ("swiglu/geglu", _glu), ("rope", _rope))
