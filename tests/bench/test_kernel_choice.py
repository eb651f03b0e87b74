"""bench/kernel_choice.py times a kernel impl and the XLA lowering of its op for each case
and says what the model and the measurement choose (off TPU: wall time, kernels in
interpret mode, and nothing written)."""
from __future__ import annotations

import torch

from tpu_kernels.bench import kernel_choice
from tpu_kernels.registry.costs import measured


def test_kernel_choice_times_both_sides_of_each_case():
    cases = [kernel_choice._mm(128, 64, 192, torch.float32), kernel_choice._sdpa(2, 2, 32, 16, torch.float32)]
    lines, kept = [], []
    rows = kernel_choice.rows(cases, calls=1, out=lines.append, keep=kept.append)
    assert [r["impl"] for r in rows] == ["pallas:mm", "pallas:sdpa_flash"] and len(lines) == 2 and kept == rows
    for r in rows:
        assert r["clock"] == "wall" and r["kernel_s"] > 0 and r["xla_s"] > 0
        assert r["model_says"] in ("kernel", "xla") and r["measured_says"] in ("kernel", "xla")
        key, entry = r["entry"]
        assert key == f"{r['op']}|{r['impl']}|v5e|{entry['shapes']}" and entry["ideal_s"] > 0
    assert "float32[128,64] float32[64,192]" in lines[0] and "(wall)" in lines[0]
    assert measured.signature(*cases[0]) == "float32[128,64] float32[64,192]"
    op, (q, k, v), _ = cases[1]     # by name or by position, with the defaults: one call
    assert measured.signature(op, (q, k, v), {"is_causal": True}) == measured.signature(op, (q, k, v, 0.0, True), {}) \
        == "float32[2,2,32,16] float32[2,2,32,16] float32[2,2,32,16] float True None None"
