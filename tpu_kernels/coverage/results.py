"""The results files the report reads (``.tpu_kernels/parity.json``, ``bench.json``,
``export.json``): their state (current, stale against the newest ``registry/`` commit,
missing), each op's parity status, and its kernel-vs-XLA speed."""
from __future__ import annotations

import datetime
import json
import math
import os
import subprocess

RESULTS_DIR = ".tpu_kernels"

def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def registry_changed() -> float | None:
    """Unix time of the newest commit touching registry/, or None when git cannot say."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct", "--", "registry"], cwd=_repo_root(),
                             capture_output=True, text=True, timeout=10)
        return float(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None
    except Exception:  # noqa: BLE001
        return None


def load_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def file_state(kind: str, path: str, data: dict | None, date: str | None, changed: float | None) -> dict:
    if data is None:
        exists = os.path.exists(path)
        return {"file": path, "date": None, "state": "unreadable" if exists else "missing",
                "text": f"{kind}: {path} {'is unreadable' if exists else 'missing'}: "
                        f"{_HOW[kind]}"}
    stale = False
    try:
        ts = datetime.datetime.fromisoformat(date).timestamp() if date else os.path.getmtime(path)
        stale = changed is not None and ts < changed
    except ValueError:
        pass
    state = "stale" if stale else "current"
    text = f"{kind}: {path} from {date or 'unknown date'}"
    if stale:
        text += (f" -- STALE: older than the newest registry/ commit "
                 f"({datetime.datetime.fromtimestamp(changed).isoformat(timespec='seconds')})")
    return {"file": path, "date": date, "state": state, "text": text}


_HOW = {"parity": "no parity run recorded (run pytest tests/parity)",
        "bench": "no bench run recorded (run python -m tpu_kernels bench)",
        "export": "no TPU compile check recorded (run coverage --export-check)"}


def parity_status(entry: dict | None, have_file: bool) -> tuple[str, str]:
    """(status, detail) of one op from parity.json."""
    if not have_file:
        return "no run", "no parity run recorded"
    if entry is None:
        return "not run", "not in the last parity run"
    impls = entry.get("impls") or {}
    if not impls:
        return "untested", "no impl results"
    st = {k: v.get("status", "untested") for k, v in impls.items()}
    for status in ("fail", "known_failure"):
        bad = [k for k, s in st.items() if s == status]
        if bad:
            return status, "; ".join(f"{k}: {impls[k].get('reason', '')}"[:160] for k in bad)
    if all(s == "pass" for s in st.values()):
        return "pass", ", ".join(f"{k} ({impls[k].get('examples', '?')} examples)" for k in st)
    if any(s == "pass" for s in st.values()):
        return "pass", "; ".join(f"{k}: {s}" for k, s in st.items())
    return "untested", "; ".join(f"{k}: {impls[k].get('reason', s)}"[:160] for k, s in st.items())


def bench_speed(op_name: str, bench: dict | None) -> tuple[float | None, str]:
    """(kernel/XLA speed-up, text) for ``op_name`` from bench.json: XLA median / kernel median,
    geometric mean over cases timed for both (never interpret-mode rows)."""
    if not bench:
        return None, "-"
    rows = [r for r in bench.get("results", []) if r.get("op") == op_name and r.get("status") == "ok"
            and r.get("mode") != "interpret" and r.get("median_s")]
    if not rows:
        return None, "-"
    by_case: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        by_case.setdefault((r["case"], r["dtype"]), {}).setdefault(r["kind"], []).append(r["median_s"])
    ratios, vs_cpu = [], []
    for kinds in by_case.values():
        if "xla" in kinds:
            kern = [t for k in ("pallas", "helion", "user") for t in kinds.get(k, [])]
            if kern:
                ratios.append(min(kinds["xla"]) / min(kern))
            if "torch_cpu" in kinds:
                vs_cpu.append(min(kinds["torch_cpu"]) / min(kinds["xla"]))
    if ratios:
        g = math.exp(sum(map(math.log, ratios)) / len(ratios))
        return g, f"kernel x{g:.2f} vs xla ({len(ratios)} cases)"
    if vs_cpu:
        g = math.exp(sum(map(math.log, vs_cpu)) / len(vs_cpu))
        return None, f"no kernel timing; xla x{g:.2f} vs torch-cpu"
    return None, "-"


