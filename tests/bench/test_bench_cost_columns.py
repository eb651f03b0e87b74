"""``bench --cost-model``: per kernel, case and chip, the modelled kernel time, XLA's
estimate, their ratio and the roofline fraction, in the table and in the run's JSON."""
from __future__ import annotations

import torch

from tpu_kernels.aot import cost_table
from tpu_kernels.aot import cost_plot
from tpu_kernels.bench import runner


def test_cost_model_columns_per_chip():
    lines: list[str] = []
    info = runner.run(kernel="mm", quick=True, impl="xla", json_path=None, plots=None, out=lines.append,
                      progress=lambda m: None, warmup=0, iters=1, cost_chips=["v5e", "v6e"])
    rows = info["cost_model"]
    cases = {r["case"] for r in info["results"]}
    assert {r["chip"] for r in rows} == {"v5e", "v6e"}
    assert len(rows) == 2 * len(cases) and all(r["kernel"] == "pallas:mm" for r in rows)
    for r in rows:
        assert r["kernel_s"] > 0 and r["xla_s"] > 0 and 0 < r["roofline_fraction"] <= 1
        assert abs(r["xla_roofline_fraction"] - r["roofline_fraction"] * r["kernel_s"] / r["xla_s"]) < 1e-9
        assert abs(r["ratio"] - r["xla_s"] / r["kernel_s"]) < 1e-9 * r["ratio"]
        assert r["wins"] == ("kernel" if r["ratio"] > 1 else "XLA")
    text = "\n".join(lines)
    assert "| XLA/kernel | wins | roofline | XLA roofline |" in text and "kernels that win in no case here" in text


def test_without_the_flag_nothing_is_modelled():
    info = runner.run(kernel="mm", quick=True, impl="xla", json_path=None, plots=None, out=lambda s: None,
                      progress=lambda m: None, warmup=0, iters=1)
    assert "cost_model" not in info


def test_cost_model_plot(tmp_path):
    """The table as a PNG: ratio and both roofline shares per (kernel, case) and chip."""
    m = lambda *s: torch.empty(s, dtype=torch.bfloat16, device="meta")  # noqa: E731
    rows = cost_table.case_rows("aten::mm", (m(512, 1024), m(1024, 2048)), {}, "m512", ["v5e", "v6e"])
    path = cost_plot.plot(rows, str(tmp_path / "cost_model.png"))
    assert path is not None and (tmp_path / "cost_model.png").stat().st_size > 0
    assert cost_plot.plot([], str(tmp_path / "none.png")) is None
