"""The report's TPU column: does each Pallas/Helion impl of an op compile on v5e / v6e / v7x?

The answer comes from the real compiler: ``tpu_kernels.aot.check_impls`` compiles every
kernel impl of the op at production shapes with XLA:TPU and Mosaic from libtpu (compile-only
topologies, no TPU needed), per chip: ok with the VMEM Mosaic allocated, fail with the
compiler's reason, or n/a (the impl refuses the production input, or the op has none).
"""
from __future__ import annotations

import datetime
from typing import Any, Callable

from tpu_kernels import aot
from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry import REGISTRY
from tpu_kernels.registry.kinds import KERNEL_KINDS

FORMAT = 2                                   # export.json: impl -> {"chips": {chip: result}}
CHIPS: tuple[str, ...] = tuple(tpu_info.CHECKED_GENERATIONS)


def export_check(op: Any, progress: Callable[[str], None],
                 chips: tuple[str, ...] = CHIPS) -> dict[str, dict]:
    """Per kernel impl of ``op`` ("pallas:mm"): ``{"chips": {chip: {"status", "reason",
    "vmem_bytes", "seconds"}}, "date"}`` from a real compile for each chip."""
    today = datetime.datetime.now().isoformat(timespec="seconds")
    labels = [f"{i.kind}:{i.name}" for i in REGISTRY.impls(op) if i.kind in KERNEL_KINDS]
    results: dict[str, dict] = {label: {"chips": {}, "date": today} for label in labels}
    reason = aot.unavailable_reason()
    if reason:
        for label in labels:
            results[label]["chips"] = {c: _entry("n/a", reason) for c in chips}
        return results

    def report(r: aot.ImplResult) -> None:
        progress(f"coverage: compile {op} {r.impl} for {r.chip}: {r.status}")
    for r in aot.check_impls(chips, ops=[op.name()], progress=report):
        results[r.impl]["chips"][r.chip] = _entry(r.status, r.reason, r.vmem_bytes, r.seconds)
    return results


def _entry(status: str, reason: str = "", vmem_bytes: int | None = None,
           seconds: float = 0.0) -> dict:
    return {"status": status, "reason": reason, "vmem_bytes": vmem_bytes,
            "seconds": round(seconds, 2)}


def chip_status(res: dict, chip: str) -> str:
    """One chip's verdict over an op's kernel impls: FAIL if one fails, ok if one compiles
    and none fails, else n/a."""
    sts = [v.get("chips", {}).get(chip, {}).get("status", "n/a") for v in res.values()]
    return "FAIL" if "fail" in sts else "ok" if "ok" in sts else "n/a"


def export_text(res: dict | None) -> str:
    """The report cell: "-" without kernels, "not checked" for an entry of an older format,
    else each chip's verdict ("v5e ok v6e ok v7x FAIL")."""
    if not res:
        return "-"
    if not all("chips" in v for v in res.values()):
        return "not checked"
    chips = list(dict.fromkeys(c for v in res.values() for c in v["chips"]))
    return " ".join(f"{c} {chip_status(res, c)}" for c in chips) or "not checked"


def export_detail(res: dict) -> str:
    """Why each impl failed or was not compiled, and the VMEM of those that compiled."""
    parts = []
    for label, v in res.items():
        for chip, e in v.get("chips", {}).items():
            if e.get("status") == "ok":
                vmem = e.get("vmem_bytes")
                parts.append(f"{label} {chip}: ok" + (f", VMEM {vmem / tpu_info.MiB:.1f} MiB"
                                                      if vmem else ""))
            else:
                parts.append(f"{label} {chip}: {e.get('status')}: {e.get('reason', '')}")
    return "; ".join(parts)
