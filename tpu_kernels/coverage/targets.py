"""The target list (``aten_targets.tsv``: overloads tiers 1-3, from recorded model runs)
and how each op is covered: the route the op takes, as the report counts it."""
from __future__ import annotations

import csv
import os
from typing import Any

import torch

from tpu_kernels.registry import REGISTRY, route
from tpu_kernels.registry.kinds import KINDS
from tpu_kernels.registry.opnames import base_name

TARGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aten_targets.tsv")
# The kinds the report ranks, best first: what runs (never the CPU fallback), then "none".
ORDER = tuple(k for k in KINDS if k != "cpu") + ("none",)
IMPL_KINDS = tuple(k for k in KINDS if k not in ("runtime", "decomp", "cpu"))   # counted as kernels
TIERS = ("1", "2", "3", "custom", "hop")   # hop: higher-order ops with impls (flex_attention)
EXTRA_TIERS = ("custom", "hop")            # rows beside the target list (not counted as targets)


def load_targets(path: str = TARGETS) -> list[dict]:
    with open(path) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [{"op": r["op"], "packet": r["packet"], "tier": str(r["tier"]),
             "models": int(r["models"] or 0)} for r in rows]


# Target entries recorded on CPU that tpu never receives: the same user call reaches other
# ops on tpu. Such an entry counts as covered when those ops have impls (and the user call
# is tested: the test named here).
CPU_SPECIFIC = {
    "mkldnn_rnn_layer": (("_thnn_fused_lstm_cell", "_thnn_fused_gru_cell"),
                         "nn.LSTM/nn.GRU on tpu reach the fused cell ops (tests/ops/test_rnn.py)"),
    "mkldnn_rnn_layer_backward": (("_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell_backward"),
                                  "their backward on tpu is the cells' backward (tests/ops/test_rnn.py)"),
}


def _cpu_specific(op: Any) -> tuple[str, str] | None:
    """(kind, note) when ``op`` is a CPU-only entry whose user call is covered on tpu."""
    entry = CPU_SPECIFIC.get(base_name(op))
    if entry is None:
        return None
    targets = [getattr(torch.ops.aten, name).default for name in entry[0]]
    kinds = [i.kind for t in targets for i in REGISTRY.impls(t)]
    if not all(REGISTRY.has(t) for t in targets):
        return None
    return next(k for k in ORDER if k in kinds), f"CPU-specific: {entry[1]}"


_NOTES = {"torch._decomp": "torch._decomp decomposition",
          "CompositeImplicitAutograd": "CompositeImplicitAutograd (decomposes above the tpu key)",
          "CompositeExplicitAutograd": "CompositeExplicitAutograd (torch's kernel in ATen ops, run on tpu)"}


def classify(op: Any) -> dict:
    """Impls of ``op`` by kind, the kind that runs (``best``, from ``registry.route``),
    and whether it is covered."""
    kinds: dict[str, list[str]] = {}
    for impl in REGISTRY.impls(op):
        kinds.setdefault(impl.kind, []).append(impl.name)
    r = route(op)
    note, extra = "", {}
    if r.kind == "view":
        best, note = "runtime", "view: strided view (or value) in the tpu runtime"
    elif r.kind == "runtime":
        best, note = "runtime", f"handled by the tpu runtime ({r.impl.name})"
    elif r.kind == "impl":
        best = next(k for k in ORDER if k in kinds and k != "runtime")
    elif _cpu_specific(op) is not None:
        best, note = _cpu_specific(op)
        kinds.setdefault(best, [note])
    elif r.kind == "twin":
        best, note = "decomp", f"in place via {r.functional}"
        extra["functional"] = r.functional
    elif r.kind == "decomp":
        best, note = "decomp", _NOTES[r.impl.name]
    else:   # refused, or the CPU fallback: not covered on tpu
        best = "none"
    if best in ("runtime", "decomp"):
        kinds.setdefault(best, [note])
    return {"kinds": kinds, "best": best, "covered": best != "none", "note": note, **extra}
