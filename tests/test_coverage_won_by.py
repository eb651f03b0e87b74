"""The coverage report's "won by" column: the cost model's pick per chip for an op with a
kernel impl, at production shapes, and the kernels that win nowhere."""
from __future__ import annotations

from tpu_kernels.coverage import won_by
from tpu_kernels.coverage.render import format_markdown, never_win_lines
from tpu_kernels.pallas import tpu_info


def test_mm_column_names_each_chip_and_a_margin():
    table = won_by.rows("aten.mm.default")
    assert [r.chip for r in table] == list(tpu_info.CHECKED_GENERATIONS)
    assert all(r.decision is not None for r in table)
    cells = won_by.text(table).split(", ")
    for chip, cell, r in zip(tpu_info.CHECKED_GENERATIONS, cells, table):
        who = "kernel" if r.decision.kernel_wins else "XLA"
        assert cell.startswith(f"{chip} {who} ") and cell.endswith("x"), cell
        assert float(cell.split()[-1][:-1]) >= 1.0
    never = won_by.never_win(table)
    assert never == ([] if any(r.decision.kernel_wins for r in table) else ["pallas:mm"])


def test_rows_get_the_column_only_when_asked():
    rows = [{"op": "aten.mm.default", "kinds": {"pallas": ["mm"], "xla": ["mm"]}},
            {"op": "aten.sin.default", "kinds": {"xla": ["sin"]}}]
    assert won_by.add(rows, False, lambda m: None) is None
    assert [r["won_by"] for r in rows] == [won_by.NOT_ASKED, "-"]
    never = won_by.add(rows, True, lambda m: None)
    assert rows[0]["won_by"].startswith("v5e ") and rows[1]["won_by"] == "-"
    assert isinstance(never, list)
    assert never_win_lines({"never_win": never})[0].startswith("kernels that never win")
    assert never_win_lines({"never_win": None}) == []


def test_markdown_has_the_column():
    row = {"op": "aten.mm.default", "tier": 1, "kinds": {"pallas": ["mm"]}, "pick": "xla:mm",
           "pick_tpu": "pallas:mm", "parity": "pass", "export": "-", "speed": "-",
           "won_by": "v5e XLA 1.1x", "covered": True, "best": "pallas"}
    rep = {"totals": {"targets_covered": 1, "targets": 1, "tiers": {}, "custom_ops": 0,
                      "kernels_by_kind": {"pallas": 1, "helion": 0, "user": 0, "xla": 0},
                      "parity": {"recorded": False}, "gap": 0},
           "files": {}, "never_win": ["pallas:mm"]}
    md = format_markdown(rep, [row])
    assert "| won by (cost model) |" in md and "v5e XLA 1.1x" in md and "never win" in md and "pallas:mm" in md
