"""The coverage report as data: one row per target overload, custom op and higher-order op
with impls (flex_attention, tier "hop"): the route it takes, the impl picked for a typical
input here and on a TPU, parity, whether its kernels compile for v5e / v6e / v7x, speed;
the totals, and the state of the results files it read."""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import Any, Callable

import torch

from tpu_kernels.coverage.export import FORMAT as EXPORT_FORMAT
from tpu_kernels.coverage.export import export_check, export_detail, export_text
from tpu_kernels.coverage.inputs import pick, typical_input
from tpu_kernels.coverage.results import (RESULTS_DIR, bench_speed, file_state, load_json, parity_status,
                                          registry_changed)
from tpu_kernels.coverage import won_by as won_by_column
from tpu_kernels.coverage.targets import EXTRA_TIERS, IMPL_KINDS, ORDER, TIERS, classify, load_targets
from tpu_kernels.registry import REGISTRY
from tpu_kernels.registry.custom_ops import DECLARED
from tpu_kernels.registry.kinds import KERNEL_KINDS
from tpu_kernels.registry.opnames import is_hop, lookup_op, op_name, overload_or_none

FORMAT = 1
PARITY_STATES = ("pass", "fail", "known_failure", "untested", "not run", "no run")
FILE_STATES = ("missing", "unreadable", "stale", "current")


def _progress_printer(enabled: bool = True) -> Callable[[str], None]:
    last = [0.0]

    def progress(msg: str) -> None:
        if enabled and time.perf_counter() - last[0] > 1.0:
            last[0] = time.perf_counter()
            print(msg, file=sys.stderr, flush=True)
    return progress


def build(*, results_dir: str = RESULTS_DIR, do_export_check: bool = False,
          progress: Callable[[str], None] | None = None, export_ops: str | None = None,
          won_by: bool = False) -> dict:
    """The whole report as a dict (what ``--format json`` prints). ``do_export_check``
    compiles the kernel impls for each chip now (only of ops whose name holds
    ``export_ops``, when given) and records them in ``export.json``. ``won_by`` asks the cost
    model which impl wins per chip for each op with a kernel (``coverage.won_by``)."""
    progress = progress or _progress_printer()
    changed = registry_changed()
    parity_path = os.path.join(results_dir, "parity.json")
    bench_path = os.path.join(results_dir, "bench.json")
    export_path = os.path.join(results_dir, "export.json")
    parity = load_json(parity_path)
    bench = load_json(bench_path)
    export = load_json(export_path)
    if export and export.get("format") != EXPORT_FORMAT:
        export = None        # an older format (a TPU lowering, not a compile): not checked
    export_new: dict[str, dict] = {}

    entries = [(t["op"], t["tier"], t["models"]) for t in load_targets()]
    target_names = {e[0] for e in entries}
    for custom in DECLARED.values():
        name = str(custom.op)
        if name not in target_names:
            entries.append((name, "custom", None))
    entries += [(op_name(hop).replace("::", "."), "hop", None) for hop in REGISTRY.higher_order_ops()]
    rows = []
    start = time.perf_counter()
    for i, (name, tier, models) in enumerate(entries):
        progress(f"coverage: [{i + 1}/{len(entries)}] {name} ({time.perf_counter() - start:.0f}s)")
        op = lookup_op(name) if tier == "hop" else overload_or_none(name)
        row: dict[str, Any] = {"op": name, "tier": tier, "models": models}
        if op is None:
            row.update(kinds={}, best="none", covered=False, note="overload not in this torch build",
                       input="n/a", pick="n/a", pick_tpu="n/a")
        else:
            info = classify(op)
            # a higher-order op's impls see a spec built from callables: no typical input
            inp = typical_input(op) if info["best"] not in ("none", "runtime") and not is_hop(op) else None
            runtime = info["best"] == "runtime"
            row.update(kinds=info["kinds"], best=info["best"], covered=info["covered"], note=info["note"],
                       input=inp[2] if inp else "n/a",
                       pick="runtime" if runtime else pick(op, inp),
                       pick_tpu="runtime" if runtime else pick(op, inp, on_tpu=True))
        status, detail = parity_status((parity or {}).get("ops", {}).get(name), parity is not None)
        row["parity"], row["parity_detail"] = status, detail
        kernel_impls = [k for k in KERNEL_KINDS if k in row["kinds"]]
        if not kernel_impls:
            row["export"] = "-"
        elif do_export_check and op is not None and not is_hop(op) and (not export_ops or export_ops in name):
            export_new[name] = export_check(op, progress)
            row["export"] = export_text(export_new[name])
            row["export_detail"] = export_detail(export_new[name])
        elif export and name in export.get("ops", {}):
            row["export"] = export_text(export["ops"][name])
            row["export_detail"] = export_detail(export["ops"][name])
        else:
            row["export"] = "not checked"
        ratio, text = bench_speed(name, bench)
        row["speed"], row["speed_ratio"] = text, ratio
        rows.append(row)

    never_win = won_by_column.add(rows, won_by, progress)
    if do_export_check:
        export = {"format": EXPORT_FORMAT, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "ops": {**((export or {}).get("ops", {})), **export_new}}
        os.makedirs(results_dir, exist_ok=True)
        with open(export_path, "w") as f:
            json.dump(export, f, indent=1)

    files = {
        "parity": file_state("parity", parity_path, parity, (parity or {}).get("updated"), changed),
        "bench": file_state("bench", bench_path, bench, (bench or {}).get("date"), changed),
        "export": file_state("export", export_path, export, (export or {}).get("date"), changed),
    }
    kernels: dict[str, int] = {}
    for op in REGISTRY.ops() + REGISTRY.higher_order_ops():
        for impl in REGISTRY.impls(op):
            kernels[impl.kind] = kernels.get(impl.kind, 0) + 1
    return {"format": FORMAT, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "torch": torch.__version__, "registry_changed": (
                datetime.datetime.fromtimestamp(changed).isoformat(timespec="seconds") if changed else None),
            "files": files, "totals": totals(rows, kernels, parity is not None), "rows": rows,
            "never_win": never_win}


def totals(rows: list[dict], kernels: dict[str, int], have_parity: bool) -> dict:
    tiers: dict[str, dict] = {}
    for r in rows:
        t = tiers.setdefault(r["tier"], {"total": 0, "covered": 0, "by_kind": {k: 0 for k in ORDER}})
        t["total"] += 1
        t["covered"] += r["covered"]
        t["by_kind"][r["best"]] += 1
    targets = [r for r in rows if r["tier"] not in EXTRA_TIERS]
    tested = [r for r in rows if r["parity"] in ("pass", "fail", "known_failure")]
    passed = sum(r["parity"] == "pass" for r in tested)
    return {
        "tiers": tiers,
        "targets": len(targets), "targets_covered": sum(r["covered"] for r in targets),
        "gap": len(targets) - sum(r["covered"] for r in targets),
        "custom_ops": sum(r["tier"] == "custom" for r in rows),
        "higher_order_ops": sum(r["tier"] == "hop" for r in rows),
        "kernels_by_kind": {k: kernels.get(k, 0) for k in IMPL_KINDS},
        "parity": {"recorded": have_parity, "tested": len(tested), "passed": passed,
                   "rate": passed / len(tested) if tested else None},
    }


def check_report(rep: dict) -> list[str]:
    """What is wrong with a report's shape (the JSON format other tools read): missing
    keys and values outside their sets; empty when it is well formed."""
    errs = [f"missing {k!r}" for k in ("format", "date", "files", "totals", "rows") if k not in rep]
    for name, f in rep.get("files", {}).items():
        if f.get("state") not in FILE_STATES:
            errs.append(f"files.{name}.state: {f.get('state')!r}")
    row_keys = ("op", "tier", "kinds", "best", "covered", "input", "pick", "pick_tpu", "parity", "export", "speed")
    for i, r in enumerate(rep.get("rows", [])):
        errs += [f"rows[{i}]: missing {k!r}" for k in row_keys if k not in r]
        for key, allowed in (("tier", TIERS), ("best", ORDER), ("parity", PARITY_STATES)):
            if key in r and r[key] not in allowed:
                errs.append(f"rows[{i}].{key}: {r[key]!r} not in {list(allowed)}")
        if not isinstance(r.get("covered"), bool):
            errs.append(f"rows[{i}].covered: not a bool")
    return errs
