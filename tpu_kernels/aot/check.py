"""Compile every kernel for a list of chips and say, per (kernel, chip), whether it compiles,
why not, and how much VMEM it takes: the kernel cases at production shapes
(``check_kernels``) and the registry's Pallas/Helion impls (``check_impls``, the coverage
report's "compiles on" column)."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable, Sequence

from tpu_kernels.aot import cases as kernel_cases
from tpu_kernels.aot.compiler import compile, explain
from tpu_kernels.aot.summary import Summary
from tpu_kernels.pallas import tpu_info


@dataclasses.dataclass(frozen=True)
class Result:
    """One (kernel, chip) compile."""
    kernel: str
    chip: str
    ok: bool
    reason: str                   # "" when ok
    vmem_bytes: int | None        # the largest Mosaic kernel's scoped VMEM (compiler figure)
    seconds: float
    summary: Summary | None = None

    def cell(self) -> str:
        """A table cell: "ok 12.3 MiB, 4.1 s" (VMEM, compile time) or "FAIL: reason"."""
        if not self.ok:
            return f"FAIL: {self.reason}"
        vmem = "VMEM n/a" if self.vmem_bytes is None else f"{self.vmem_bytes / tpu_info.MiB:.1f} MiB"
        return f"ok {vmem}, {self.seconds:.1f} s"


def check(name: str, fn: Callable[..., Any], specs: Sequence[Any], chip: str) -> Result:
    """Compile ``fn(*specs)`` for ``chip``; a failure becomes a Result with its reason. A
    program that compiles but holds no Mosaic kernel failed too: the kernel did not take
    its TPU path."""
    start = time.perf_counter()
    try:
        summary = compile(fn, *specs, chip=chip).summary
    except Exception as exc:  # noqa: BLE001  (any compiler error is a verdict, not a crash)
        return Result(name, chip, False, explain(exc), None, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if not summary.kernels:
        return Result(name, chip, False, "compiled, but no Mosaic kernel in the program",
                      None, seconds, summary)
    return Result(name, chip, True, "", summary.max_kernel_vmem, seconds, summary)


def check_kernels(chips: Iterable[str] = tpu_info.CHECKED_GENERATIONS,
                  names: Iterable[str] | None = None, thorough: bool = False,
                  progress: Callable[[Result], None] | None = None) -> list[Result]:
    """Every kernel case (``tpu_kernels.aot.cases``) compiled for each chip."""
    wanted = None if names is None else set(names)
    results = []
    for chip in chips:
        for c in kernel_cases.cases(thorough):
            if wanted is not None and c.name not in wanted:
                continue
            r = check(c.name, c.fn, c.specs, chip)
            results.append(r)
            if progress:
                progress(r)
    return results


def table(results: Sequence[Result]) -> str:
    """Markdown table kernel x chip."""
    chips = list(dict.fromkeys(r.chip for r in results))
    rows = list(dict.fromkeys(r.kernel for r in results))
    cell = {(r.kernel, r.chip): r.cell() for r in results}
    out = ["| kernel | " + " | ".join(chips) + " |", "|---" * (len(chips) + 1) + "|"]
    for k in rows:
        out.append(f"| {k} | " + " | ".join(cell.get((k, c), "-") for c in chips) + " |")
    return "\n".join(out)
