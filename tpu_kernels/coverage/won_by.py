"""The coverage report's "won by" column: for an op with a Pallas or Helion impl, which impl
the cost model picks on each checked chip at the op's production shapes (the ``prod``
class of ``python -m tpu_kernels costs``) and by how much (the modelled time ratio), and
the kernels that win nowhere.

    v5e kernel 1.8x, v6e XLA 1.3x, v7x kernel 1.1x
"""
from __future__ import annotations

from typing import Callable

from tpu_kernels.aot import cost_table
from tpu_kernels.aot.impls import ARGS
from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry import resolve_overload
from tpu_kernels.registry.kinds import KERNEL_KINDS

CLASS = "prod"


def rows(name: str) -> list[cost_table.Row]:
    """The cost table's rows of ``name`` (an op with a kernel impl) at production shapes."""
    key = _args_key(name)
    if key is None:
        return []
    return cost_table.rows([key], tpu_info.CHECKED_GENERATIONS, (CLASS,))


def text(table_rows: list[cost_table.Row]) -> str:
    """Per chip, the winner and its margin; a kernel impl the op has more than one of is named."""
    kernels = {r.kernel for r in table_rows}
    cells = []
    for r in table_rows:
        d = r.decision
        who = r.kernel if len(kernels) > 1 else "kernel"
        if d is None:
            cells.append(f"{r.chip} {'refused' if r.refused else 'not modelled'}")
        elif d.kernel_wins:
            cells.append(f"{r.chip} {who} {d.ratio:.1f}x")
        else:
            cells.append(f"{r.chip} XLA {1 / d.ratio:.1f}x" if d.ratio else f"{r.chip} XLA")
    return ", ".join(cells) or "-"


def never_win(table_rows: list[cost_table.Row]) -> list[str]:
    """The kernels of ``table_rows`` that lose (or are refused, or cannot be modelled) everywhere."""
    return cost_table.never_win(table_rows)


def _args_key(name: str) -> str | None:
    """``ARGS``'s key for the report's op name ("aten.mm.default" -> "aten::mm")."""
    op = resolve_overload(name)
    for key in ARGS:
        if resolve_overload(key) == op:
            return key
    return None


NOT_ASKED = "not computed (--won-by)"


def add(report_rows: list[dict], compute: bool, progress: Callable[[str], None]) -> list[str] | None:
    """Set each report row's ``won_by`` cell ("-" for an op without a kernel impl); return the
    kernels that win on no chip, or None when ``compute`` is off (tracing every kernel for
    every chip takes minutes: ``coverage --won-by`` asks for it)."""
    every: list[cost_table.Row] = []
    for r in report_rows:
        if not any(k in r["kinds"] for k in KERNEL_KINDS):
            r["won_by"] = "-"
        elif not compute:
            r["won_by"] = NOT_ASKED
        else:
            progress(f"coverage: cost model for {r['op']}")
            table_rows = rows(r["op"])
            r["won_by"] = text(table_rows)
            every += table_rows
    return never_win(every) if compute else None
