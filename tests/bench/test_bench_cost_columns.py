"""``bench --cost-model``: per kernel, case and chip, the modelled kernel time, XLA's
estimate, their ratio and the roofline fraction, in the table and in the run's JSON."""
from __future__ import annotations

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
        assert abs(r["ratio"] - r["xla_s"] / r["kernel_s"]) < 1e-9 * r["ratio"]
        assert r["wins"] == ("kernel" if r["ratio"] > 1 else "XLA")
    text = "\n".join(lines)
    assert "| XLA/kernel | wins | roofline |" in text and "kernels that win in no case here" in text


def test_without_the_flag_nothing_is_modelled():
    info = runner.run(kernel="mm", quick=True, impl="xla", json_path=None, plots=None, out=lambda s: None,
                      progress=lambda m: None, warmup=0, iters=1)
    assert "cost_model" not in info
