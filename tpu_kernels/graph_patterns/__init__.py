"""Hand-written model code rewritten to the kernel ops, in ``torch.compile(backend="tpu")``
graphs: an FX pass over Dynamo's graph, before AOTAutograd (so the fused ops' own
derivatives make the backward graph). One module per pattern family:

    norms.py          RMSNorm -> aten._fused_rms_norm; LayerNorm -> aten.native_layer_norm
    glu.py            silu(a) * b, gelu(a) * b -> tpu_kernels.swiglu / geglu
    rope.py           x * cos + rotate(x) * sin for q and k (rotate_half or interleaved) -> tpu_kernels.rope
    attention.py      softmax(q @ kT * scale [+ mask]) @ v -> F.scaled_dot_product_attention (flash)
    cross_entropy.py  F.cross_entropy(F.linear(h, W) ...) -> tpu_kernels.linear_cross_entropy

Each rewrite keeps the graph's values: the replaced nodes' inputs have no other users,
and the ops compute what the pattern computes (dtypes included: a pattern whose
promotion differs is left as written). A result a later op writes into (``o += c``
after hand-written attention, Nystromformer's) is left as written: the fused op's
derivative may save its output (flash attention's does), which autograd would then
find changed. Only the nodes a rewrite left unused are erased
(FX's own dead-code pass counts every ``call_method`` as pure, so it would drop the
in-place ``index_copy_`` of a static KV cache, whose result nobody reads). ``REWRITES``
counts what was rewritten in this process. The pass is on by default;
``TPU_KERNELS_GRAPH_PATTERNS=0`` turns it off.

Deferred mode does not apply these patterns: it records each op below autograd as it is
dispatched, after torch has already built the backward graph from the unfused ops, so
there is no model-level graph left to rewrite (XLA fuses each recorded stretch instead).
"""
from __future__ import annotations

import collections
import os
from typing import Callable

from torch import fx

from tpu_kernels.graph_patterns.attention import attention
from tpu_kernels.graph_patterns.cross_entropy import linear_cross_entropy
from tpu_kernels.graph_patterns.glu import glu
from tpu_kernels.graph_patterns.match import in_place, written_later
from tpu_kernels.graph_patterns.norms import layer_norm, rms_norm
from tpu_kernels.graph_patterns.rope import rope

REWRITES: collections.Counter = collections.Counter()
RULES: tuple[tuple[str, Callable[[fx.Graph, fx.Node], list[fx.Node]]], ...] = (
    ("rms_norm", rms_norm), ("layer_norm", layer_norm), ("swiglu/geglu", glu), ("rope", rope),
    ("attention", attention), ("linear_cross_entropy", linear_cross_entropy))


def rewrite(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite the patterns above in ``gm`` (in place) and return it."""
    if not enabled():
        return gm
    replaced: list[fx.Node] = []
    for name, rule in RULES:
        for node in list(gm.graph.nodes):
            if not node.users or written_later(node):   # rewritten already (or dead); written into
                continue
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
        if getattr(n, "_erased", False) or n.users or n.op not in ("call_function", "call_method") or n.is_impure() \
                or in_place(n):
            continue
        inputs = n.all_input_nodes
        graph.erase_node(n)
        stack.extend(i for i in inputs if i not in stack)

