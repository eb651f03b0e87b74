"""bench/compile_overhead.py measures every layer of a compiled call (the add case, few calls)."""
from __future__ import annotations

import math

import torch

from tpu_kernels.bench import compile_overhead


def test_every_layer_of_a_compiled_add_is_timed():
    fn, args = (lambda a, b: a + b), (torch.randn(8, 8, device="tpu"), torch.randn(8, 8, device="tpu"))
    row = compile_overhead.measure("add", fn, args, calls=5)
    layers = ["compiled", "frame", "guards", "aot", "program", "jit", "exe", "exe-idle", "eager", "graph"]
    assert all(row[k] > 0 for k in layers), row
    # differences of timings: finite, and the sum they are defined by
    assert math.isfinite(row["exe-cold"]) and row["over-cold"] == row["compiled"] - row["exe-cold"], row
    assert row["overhead"] == row["compiled"] - row["exe"], row
