"""Collects the parity/OpInfo records of a run into ``.tpu_kernels/parity.json`` (format:
known.py). Each process (xdist worker or not) appends its records as they come to its
own ``.tpu_kernels/parity.<pid>.jsonl``; at the end of a session every pending JSONL file
(also those of crashed workers) is merged into parity.json under a file lock."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import known  # noqa: E402

_PENDING = os.path.join(os.path.dirname(known.RESULTS), f"parity.{os.getpid()}.jsonl")


def pytest_runtest_logreport(report):
    recs = []
    for name, value in getattr(report, "user_properties", ()):
        if name == "tpu_kernels_parity" and report.when == "call":
            recs.extend(value if isinstance(value, list) else [value])
    if recs and not hasattr(report, "node"):      # in the process that ran the test
        os.makedirs(os.path.dirname(_PENDING), exist_ok=True)
        with open(_PENDING, "a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")


def pytest_sessionfinish(session, exitstatus):
    known.merge_pending(os.environ.get("TPU_KERNELS_HYPOTHESIS_PROFILE", "ci"))
