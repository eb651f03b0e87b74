"""bench/call_anatomy.py runs every case and reports four times for each (three positive; the
fourth, a difference of two timings, a number)."""
from __future__ import annotations

import math
import sys

from tpu_kernels.bench import call_anatomy


def test_call_anatomy_prints_every_case(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["call_anatomy", "--reps", "3", "--counts", "1,4"])
    call_anatomy.main()
    out = capsys.readouterr().out
    for n in (1, 4):
        for name in call_anatomy.cases(n):
            line = next(li for li in out.splitlines() if li.startswith(name + " "))
            times = [float(x) for x in line[len(name):].split()]
            assert len(times) == 4 and all(t > 0 for t in times[:3]) and math.isfinite(times[3]), line
