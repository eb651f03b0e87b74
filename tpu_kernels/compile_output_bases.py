"""Outputs of a compiled training graph that are views of one tensor the graph does not return.

For ``y = x @ w; return y[0], y[1:]`` AOTAutograd returns ``y`` from the compiled graph as
an extra "intermediate base" and remakes both views from it, but not when the inputs are
tensor subclasses, as tpu tensors are: there it raises ("ANY output aliasing ... is
currently unsupported"; transformers' ProphetNet returns two slices of its logits). Made an
ordinary output of Dynamo's graph, ``y`` is no longer an intermediate: AOTAutograd remakes
the views from that output, which it does for subclasses, and the call drops ``y`` again.
The outputs stay views of one tensor, and gradients flow through both, as eagerly.
"""
from __future__ import annotations

import collections
from typing import Any, Callable

import torch
from torch import fx


def return_shared_bases(gm: fx.GraphModule) -> int:
    """Append to ``gm``'s outputs (in place) each intermediate that two or more of its
    outputs are views of, as Dynamo's example values show; how many were appended."""
    output = gm.graph.output_node()
    outs = output.args[0]
    if not isinstance(outs, (tuple, list)):
        return 0
    made_by = {id(n.meta["example_value"]): n for n in gm.graph.nodes
               if isinstance(n.meta.get("example_value"), torch.Tensor)}
    returned = set(o for o in outs if isinstance(o, fx.Node))
    views_of: collections.Counter[fx.Node] = collections.Counter()
    for o in outs:      # an output returned twice counts twice
        base = getattr(o.meta.get("example_value"), "_base", None) if isinstance(o, fx.Node) else None
        node = made_by.get(id(base)) if base is not None else None
        if node is not None and node.op not in ("placeholder", "get_attr") and node not in returned:
            views_of[node] += 1
    bases = [n for n, k in views_of.items() if k > 1]
    if bases:
        output.args = (type(outs)([*outs, *bases]),)
        gm.recompile()
    return len(bases)


def dropping_last(fn: Callable, n: int) -> Callable:
    """``fn`` with its last ``n`` results left out (Dynamo calls a backend's result with
    the arguments spread, whatever a copied ``_boxed_call`` attribute says)."""
    if not n:
        return fn

    def call(*args: Any) -> Any:
        return fn(*args)[:-n]
    call.__wrapped__ = fn   # what it calls
    return call
