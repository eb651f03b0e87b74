"""The cost model's data and report: XLA's compiled estimates per (op, chip, shape class),
and each kernel impl against them.

    python -m tpu_kernels costs                 # the kernel x chip x shape class table
    python -m tpu_kernels costs --write         # compile XLA's programs, update the shipped data

Shape classes are the production arguments of ``tpu_kernels.aot.impls.ARGS`` (Llama-3-8B
sizes, bf16) with some sizes replaced (``CLASSES``): fewer tokens, ragged sizes that do not
divide any block, head_dim 64.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any, Callable, Iterable

import torch
from torch.utils._pytree import tree_map

from tpu_kernels.aot import cost_plot
from tpu_kernels.aot.compiler import compile as aot_compile
from tpu_kernels.aot.impls import ARGS
from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry import REGISTRY, resolve_overload
from tpu_kernels.registry.costs import decide, xla_table
from tpu_kernels.registry.costs.program import program

# shape class -> {production size: its size in the class}; ``ops``: the ops it applies to
CLASSES: dict[str, dict[int, int]] = {
    "prod": {},
    "small": {8192: 512, 16384: 1024},
    "ragged": {8192: 520, 16384: 1040, 4096: 1100, 14336: 1408, 128256: 50257},
    "hd64": {128: 64},
}
_HD64_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu",
             "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "tpu_kernels::rope")


def class_args(op_name: str, cls: str) -> tuple[tuple, dict] | None:
    """``op_name``'s production arguments with the class's sizes (None: not for this op)."""
    if cls == "hd64" and op_name not in _HD64_OPS:
        return None
    sizes = CLASSES[cls]
    args, kwargs = ARGS[op_name]()

    def swap(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return torch.empty([sizes.get(d, d) for d in x.shape], dtype=x.dtype, device="meta")
        if isinstance(x, int) and not isinstance(x, bool):
            return sizes.get(x, x)
        return x
    return tree_map(swap, args), tree_map(swap, kwargs)


def _xla_impl(op: Any) -> Any:
    return next((i for i in REGISTRY.impls(op) if i.kind == "xla"), None)


def _kernel_impls(op: Any) -> list:
    return [i for i in REGISTRY.impls(op) if i.kind in ("pallas", "helion")]


def measure(ops: Iterable[str] | None = None, chips: Iterable[str] = tpu_info.CHECKED_GENERATIONS,
            classes: Iterable[str] = tuple(CLASSES),
            progress: Callable[[str], None] | None = None) -> dict[str, dict]:
    """Compile each kernel-bound op's XLA lowering per (chip, class): table entries."""
    entries: dict[str, dict] = {}
    for name in ops or ARGS:
        op = resolve_overload(name)
        xla = _xla_impl(op)
        if xla is None or not _kernel_impls(op):
            continue
        for cls in classes:
            made = class_args(name, cls)
            if made is None:
                continue
            args, kwargs = made
            for chip in chips:
                entry = _entry(op, xla, args, kwargs, tpu_info.chip(chip).name)
                k = xla_table.key(op.name(), tpu_info.chip(chip).name, args, kwargs)
                if entry is not None:
                    entries[k] = entry
                if progress:
                    progress(f"{name} {cls} {chip}: {entry}")
    return entries


def _entry(op: Any, xla: Any, args: tuple, kwargs: dict, chip: str) -> dict | None:
    fn, specs = program(op, xla, args, kwargs)
    shapes = xla_table.signature(args, kwargs, bucket=False)
    known = xla_table.table().get(xla_table.key(op.name(), chip, args, kwargs))
    if known is not None and known["shapes"] == shapes:    # compiled before: refresh the ideal
        return {**known, "roofline": xla_table.ideal_seconds(fn, specs, chip)}
    start = time.perf_counter()
    try:
        cost = aot_compile(fn, *specs, chip=chip).executable.cost_analysis()
    except Exception:  # noqa: BLE001  (XLA cannot compile it: no figure for this class)
        return None
    seconds, basis = compiled_seconds(cost, chip)
    if seconds <= 0:
        return None
    return {"seconds": seconds, "roofline": xla_table.ideal_seconds(fn, specs, chip),
            "shapes": shapes, "basis": basis,
            "compile_s": round(time.perf_counter() - start, 2)}


def compiled_seconds(cost: dict, chip: str) -> tuple[float, str]:
    """The compiled program's time from its ``cost_analysis()``: XLA's ``optimal_seconds``,
    or, where the compiler gives none (a negative figure: seen for cross entropy's and the
    norms' backward lowerings), the program's own flops and bytes accessed at the chip's
    peak and bandwidth, whichever takes longer."""
    seconds = float(cost.get("optimal_seconds", 0.0) or 0.0)
    if seconds > 0:
        return seconds, "optimal_seconds"
    row = tpu_info.chip(chip)
    flops, moved = float(cost.get("flops", 0.0) or 0.0), float(cost.get("bytes accessed", 0.0) or 0.0)
    return max(flops / row.bf16_flops, moved / row.hbm_bytes_per_s), "flops+bytes"


@dataclasses.dataclass(frozen=True)
class Row:
    kernel: str
    op: str
    chip: str
    shape_class: str
    decision: decide.Decision | None
    refused: str = ""

    @property
    def roofline_fraction(self) -> float | None:
        """The op's ideal time on the chip over the kernel's modelled time."""
        d = self.decision
        if d is None:
            return None
        return d.useful_seconds / d.kernel_seconds if d.kernel_seconds else 0.0

    @property
    def xla_roofline_fraction(self) -> float | None:
        """The op's ideal time on the chip over XLA's estimated time."""
        d = self.decision
        if d is None:
            return None
        return d.useful_seconds / d.xla_seconds if d.xla_seconds else 0.0

    def cells(self) -> list[str]:
        d = self.decision
        if d is None:
            return [self.kernel, self.op, self.chip, self.shape_class, "-", "-", "-",
                    self.refused or "not modelled", "-", "-"]
        return [self.kernel, self.op, self.chip, self.shape_class, _fmt(d.kernel_seconds),
                f"{_fmt(d.xla_seconds)} ({d.source})", f"{d.ratio:.2f}",
                "kernel" if d.kernel_wins else "XLA", f"{self.roofline_fraction:.0%}",
                f"{self.xla_roofline_fraction:.0%}"]

    def as_dict(self) -> dict:
        """The row for JSON (seconds, not formatted text)."""
        d = self.decision
        out = {"kernel": self.kernel, "op": self.op, "chip": self.chip, "class": self.shape_class,
               "refused": self.refused}
        if d is not None:
            out.update(kernel_s=d.kernel_seconds, xla_s=d.xla_seconds, xla_source=d.source,
                       ratio=d.ratio, wins="kernel" if d.kernel_wins else "XLA",
                       roofline_fraction=self.roofline_fraction,
                       xla_roofline_fraction=self.xla_roofline_fraction)
        return out


def _fmt(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def rows(ops: Iterable[str] | None = None, chips: Iterable[str] = tpu_info.CHECKED_GENERATIONS,
         classes: Iterable[str] = tuple(CLASSES)) -> list[Row]:
    """Every kernel impl against XLA per (op, chip, class), from the shipped table."""
    out = []
    for name in ops or ARGS:
        for cls in classes:
            made = class_args(name, cls)
            if made is not None:
                out += case_rows(name, *made, cls, chips)
    return out


def case_rows(name: str, args: tuple, kwargs: dict, label: str, chips: Iterable[str]) -> list[Row]:
    """Each kernel impl of op ``name`` against its XLA lowering for these (meta) arguments,
    per chip; ``label`` names the shape class or case in the rows."""
    op = resolve_overload(name)
    xla = _xla_impl(op)
    out = []
    for impl in _kernel_impls(op):
        for chip in chips:
            row = tpu_info.chip(chip).name
            with tpu_info.compile_for(row):
                refused = impl.check(*args, **kwargs)
            d = None if refused or xla is None else decide.decide(op, impl, xla, args, kwargs, row)
            out.append(Row(f"{impl.kind}:{impl.name}", name, row, label, d, refused or ""))
    return out


HEADER = ["kernel", "op", "chip", "class", "kernel (modelled)", "XLA (estimate)", "XLA/kernel",
          "wins", "roofline", "XLA roofline"]


def markdown(table_rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|---" * len(HEADER) + "|"]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in table_rows]
    return "\n".join(lines)


def never_win(table_rows: list[Row]) -> list[str]:
    """Kernels that lose (or are refused) in every (chip, class) of the table."""
    by: dict[str, bool] = {}
    for r in table_rows:
        won = r.decision is not None and r.decision.kernel_wins
        by[r.kernel] = by.get(r.kernel, False) or won
    return [k for k, won in by.items() if not won]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chip", default=",".join(tpu_info.CHECKED_GENERATIONS),
                        help="chip(s), comma-separated (default: the checked generations)")
    parser.add_argument("--op", default="", help="op(s), comma-separated (default: every kernel-bound op)")
    parser.add_argument("--class", dest="classes", default=",".join(CLASSES),
                        help=f"shape class(es) of {list(CLASSES)}")
    parser.add_argument("--write", action="store_true",
                        help="first compile XLA's programs for these (libtpu, ~1-25 s each) and update "
                             "the shipped table")
    parser.add_argument("--plot", metavar="PNG", default=None,
                        help="also draw the table (ratio and roofline shares per chip), e.g. docs/cost_model.png")


def main_args(args: argparse.Namespace) -> int:
    chips = [tpu_info.chip(c).name for c in args.chip.split(",") if c]
    ops = [o for o in args.op.split(",") if o] or None
    classes = [c for c in args.classes.split(",") if c]
    if args.write:
        for name in ops or ARGS:
            xla_table.write(measure([name], chips, classes, progress=lambda s: print(s, flush=True)))
    table_rows = rows(ops, chips, classes)
    print(markdown(table_rows))
    print("\nkernels that never win here: " + (", ".join(never_win(table_rows)) or "none"))
    if args.plot:
        print(f"plot: {cost_plot.plot(table_rows, args.plot)}")
    return 0
