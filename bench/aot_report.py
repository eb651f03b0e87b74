"""What the real TPU compiler says about every kernel and the bundled models, per chip,
without a TPU (libtpu's compile-only topologies, ``tpu_kernels.aot``), as a markdown page.

- every Pallas and Helion kernel at production shapes (``tpu_kernels.aot.cases``, forward
  and backward in one program): compiles or the compiler's reason, the largest kernel's
  scoped VMEM, the compile time; then each program's HBM and XLA's roofline estimate;
- the bundled models' training steps (``torch.compile(backend="tpu")`` forward and
  backward graphs and the fused AdamW step): HBM per chip, XLA's step-time estimate and
  the MFU it implies.

    python -m tpu_kernels.bench.aot_report -o bench/results/aot.md
    python -m tpu_kernels.bench.aot_report --chips v6e --models gpt --no-kernels

Compile times are this machine's wall clock (libtpu's first load is kept out of them).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import sys
import time
from typing import Sequence

from tpu_kernels import aot
from tpu_kernels.aot import training
from tpu_kernels.pallas import tpu_info

MiB, GiB = tpu_info.MiB, tpu_info.GiB
MODELS = ("gpt", "llama-small", "qwen3-moe-small", "llama3-8b")


def kernel_tables(results: Sequence[aot.Result]) -> list[str]:
    """The kernel x chip table (with compile times) and the programs' compiler figures."""
    out = ["## Kernels x chips", "",
           "Forward and backward at production shapes (`tpu_kernels/aot/cases.py`). A cell: "
           "compiles, the largest Mosaic kernel's scoped VMEM (the compiler's figure), the "
           "compile time; or the compiler's reason.", "", aot.table(results), "",
           f"Compile time of the whole set: {sum(r.seconds for r in results):.0f} s for "
           f"{len(results)} programs ({sum(r.ok for r in results)} compile).", "",
           "## The programs' figures", "",
           "HBM from `memory_analysis()`; XLA's roofline time counts each Mosaic kernel by its "
           "declared `pl.CostEstimate`.", "",
           "| kernel | chip | HBM args MiB | out MiB | temp MiB | XLA est ms | Mosaic kernels "
           "(VMEM MiB) |", "|---|---|---|---|---|---|---|"]
    for r in results:
        s = r.summary
        if s is None:
            continue
        ks = ", ".join(f"{k.name} ({(k.vmem_bytes or 0) / MiB:.1f})" for k in s.kernels)
        out.append(f"| {r.kernel} | {r.chip} | {s.argument_bytes / MiB:,.1f} | "
                   f"{s.output_bytes / MiB:,.1f} | {s.temp_bytes / MiB:,.1f} | "
                   f"{s.optimal_seconds * 1e3:.3f} | {ks} |")
    return out


def model_table(reports: Sequence[training.StepReport]) -> list[str]:
    """One row per (model, chip): HBM, XLA's step estimate, MFU, compile time."""
    out = ["## Models: one training step per chip", "",
           "Forward + backward graphs of `torch.compile(backend=\"tpu\")` and the fused AdamW "
           "step, on abstract tensors. Peak HBM is the largest program's (arguments + outputs "
           "- aliased + temporaries); the step estimate adds XLA's roofline times of the "
           "three programs (a lower bound where a program loops).", "",
           "| model | chip | params M | tokens | peak HBM GiB (of) | fwd / bwd / opt temp MiB | "
           "XLA est step ms | MFU | compile s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        hbm = tpu_info.chip(r.chip).hbm_bytes / GiB
        temps = " / ".join(f"{s.temp_bytes / MiB:,.0f}" for _, s in r.programs)
        secs = sum(s.compile_seconds for _, s in r.programs)
        if r.ok:
            step = f"{r.step_seconds * 1e3:.3f}"
            mfu = f"{r.mfu:.1%}"
        else:
            step = "; ".join(f"{kind}: {why}" for kind, why in r.failures)
            mfu = "-"
        peak = "-" if r.peak_hbm_bytes is None else f"{r.peak_hbm_bytes / GiB:.2f}"
        out.append(f"| {r.model} | {r.chip} | {r.params / 1e6:,.1f} | {r.tokens} | {peak} ({hbm:.0f}) "
                   f"| {temps or '-'} | {step} | {mfu} | {secs:.0f} |")
    return out


def _header(argv: Sequence[str]) -> list[str]:
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ("jax", "libtpu"))
    return ["# Real TPU compile report", "",
            f"Generated {datetime.date.today()} by `python -m tpu_kernels.bench.aot_report "
            f"{' '.join(argv)}` ({versions}; compile-only topologies, no TPU; "
            f"{os.cpu_count()} CPU cores). See docs/aot.md.", ""]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tpu_kernels.bench.aot_report",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", help="write the markdown here (default: stdout)")
    p.add_argument("--chips", default=",".join(tpu_info.CHECKED_GENERATIONS))
    p.add_argument("--models", default=",".join(MODELS), help="bundled names or MODULE:FACTORY")
    p.add_argument("--kernels", help="only these kernel cases (comma-separated names)")
    p.add_argument("--no-kernels", action="store_true")
    p.add_argument("--thorough", action="store_true", help="the longer list of kernel cases too")
    argv = list(sys.argv[1:] if argv is None else argv)
    a = p.parse_args(argv)
    reason = aot.unavailable_reason()
    if reason:
        print(f"aot_report: {reason}", file=sys.stderr)
        return 2
    chips = [tpu_info.chip(c).name for c in a.chips.split(",") if c]
    aot.warm(*chips)
    lines = _header(argv)
    failed = False
    if not a.no_kernels:
        names = a.kernels.split(",") if a.kernels else None
        results = aot.check_kernels(chips, names, thorough=a.thorough, progress=_progress)
        lines += kernel_tables(results) + [""]
        failed |= not all(r.ok for r in results)
    reports = []
    for name in filter(None, a.models.split(",")):
        start = time.perf_counter()
        reports += training.compile_model(training.load(name), chips)
        print(f"  {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    if reports:
        lines += model_table(reports) + [""]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines.append(f"Load average when done: {load} (compile times are wall clock: they grow "
                 "with the machine's load).")
    text = "\n".join(lines) + "\n"
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        print(text)
    return 1 if failed else 0


def _progress(r: aot.Result) -> None:
    print(f"  {r.kernel:24s} {r.chip:4s} {r.seconds:6.1f} s  {r.cell()}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
