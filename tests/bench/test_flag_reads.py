"""bench/flag_reads.py runs and times its three readers."""
from __future__ import annotations

import sys

from tpu_kernels.bench import flag_reads


def test_flag_reads_prints_each_reader(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["flag_reads", "--flags", "8", "--rounds", "1"])
    flag_reads.main()
    out = capsys.readouterr().out
    for name in flag_reads.READERS:
        line = next(li for li in out.splitlines() if name in li)
        assert float(line.split()[-1]) >= 0
