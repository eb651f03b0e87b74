"""Gated linear units written by hand, rewritten to the gated kernel ops.

    silu(a) * b                   ->  tpu_kernels.swiglu(a, b)
    gelu(a, approximate=...) * b  ->  tpu_kernels.geglu(a, b, approximate)
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import fx

from tpu_kernels.graph_patterns.match import MUL, arg, binary, dtype, is_call, only_user, replace, shape


def glu(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    ops = binary(node, *MUL)
    if ops is None:
        return []
    for act, up in (ops, ops[::-1]):
        if not only_user(act, node) or not isinstance(up, fx.Node) or shape(act) != shape(up) or shape(up) is None \
                or dtype(act) != dtype(up):
            continue
        if is_call(act, F.silu, "silu") and not arg(act, 1, "inplace", False):
            call: tuple[Callable, tuple] = (torch.ops.tpu_kernels.swiglu.default, (act.args[0], up))
        elif is_call(act, F.gelu, "gelu"):
            call = (torch.ops.tpu_kernels.geglu.default, (act.args[0], up, arg(act, 1, "approximate", "none")))
        else:
            continue
        with graph.inserting_before(node):
            out = graph.call_function(*call)
        replace(node, out)
        return [node]
    return []
