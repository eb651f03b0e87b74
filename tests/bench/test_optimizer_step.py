"""bench/optimizer_step.py times both variants of each case and finds them bit-equal."""
from __future__ import annotations

import math

from tpu_kernels.bench import optimizer_step


def test_optimizer_step_bench_times_both_variants():
    lines, before = [], optimizer_step.fused_step_programs.ON
    rows = optimizer_step.run(["small"], ["AdamW"], rounds=1, out=lines.append)
    assert [r["case"] for r in rows] == ["opt.step()", "loop"] and len(lines) == 2
    for r in rows:
        assert r["programs_ms"] > 0 and r["plain_ms"] > 0
        assert math.isclose(r["ratio"], r["programs_ms"] / r["plain_ms"])
        assert r["bit_equal"] is True
    assert optimizer_step.fused_step_programs.ON is before   # the setting is restored
