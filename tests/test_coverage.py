"""`python -m tpu_kernels coverage`: counts agree with the registry, --missing is exact, the
JSON is well formed, a user op shows up, the chart is written, model_ops traces GPT."""
from __future__ import annotations

import json

import pytest
import torch

from tpu_kernels import aot, coverage, registry
from tpu_kernels.coverage import export
from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry.custom_ops import DECLARED
from tpu_kernels.registry.opnames import overload_or_none


@pytest.fixture(scope="module")
def user_op():
    """A user op registered for the whole module (custom ops cannot be undefined)."""
    name = "covtest::scale2"
    if name not in DECLARED:
        @registry.tpu_kernel(name)
        def scale2(x: torch.Tensor) -> torch.Tensor:
            return x * 2
    return name


@pytest.fixture(scope="module")
def report(user_op, tmp_path_factory):
    d = tmp_path_factory.mktemp("results")
    parity = {"format": 1, "updated": "2000-01-01T00:00:00", "ops": {
        "aten.add.Tensor": {"impls": {"xla:add": {"kind": "xla", "status": "pass", "examples": 3}}},
        "aten.mul.Tensor": {"impls": {"xla:mul": {"kind": "xla", "status": "fail", "reason": "boom"}}},
        "aten.sub.Tensor": {"impls": {"xla:sub": {"kind": "xla", "status": "known_failure",
                                                  "reason": "rounding"}}}}}
    (d / "parity.json").write_text(json.dumps(parity))
    return coverage.build(results_dir=str(d), progress=lambda m: None), d


def test_counts_agree_with_registry(report):
    rep, _ = report
    targets = coverage.load_targets()
    rows = {r["op"]: r for r in rep["rows"]}
    assert {t["op"] for t in targets} <= set(rows)
    for t in targets:
        r = rows[t["op"]]
        assert r["tier"] == t["tier"]
        op = overload_or_none(t["op"])
        if op is None:
            assert not r["covered"]
            continue
        kinds = {i.kind for i in registry.impls(op)}
        assert kinds <= set(r["kinds"]), t["op"]
        if kinds and r["best"] not in ("runtime",):
            assert r["best"] == next(k for k in coverage.ORDER if k in kinds)
    tot = rep["totals"]
    assert tot["targets"] == len(targets)
    assert tot["targets_covered"] == sum(rows[t["op"]]["covered"] for t in targets)
    assert tot["gap"] == tot["targets"] - tot["targets_covered"]
    for tier, t in tot["tiers"].items():
        assert t["total"] == sum(r["tier"] == tier for r in rep["rows"])
        assert sum(t["by_kind"].values()) == t["total"]
    ops = registry.REGISTRY.ops() + registry.REGISTRY.higher_order_ops()
    n_pallas = sum(i.kind == "pallas" for op in ops for i in registry.impls(op))
    assert tot["kernels_by_kind"]["pallas"] == n_pallas
    # a known case: mm has a Pallas kernel and an XLA lowering; on a TPU the kernel is picked
    mm = rows["aten.mm.default"]
    assert {"pallas", "xla"} <= set(mm["kinds"]) and mm["best"] == "pallas"
    assert mm["pick_tpu"] == "pallas:mm" and mm["input"] == "float32[8, 8], float32[8, 8]"
    assert "ops" in coverage.totals_line(rep) or "target overloads" in coverage.totals_line(rep)


def test_parity_and_files(report):
    rep, d = report
    rows = {r["op"]: r for r in rep["rows"]}
    assert rows["aten.add.Tensor"]["parity"] == "pass"
    assert rows["aten.mul.Tensor"]["parity"] == "fail" and "boom" in rows["aten.mul.Tensor"]["parity_detail"]
    assert rows["aten.sub.Tensor"]["parity"] == "known_failure"
    assert rows["aten.div.Tensor"]["parity"] == "not run"
    assert rep["totals"]["parity"] == {"recorded": True, "tested": 3, "passed": 1, "rate": 1 / 3}
    assert rep["files"]["parity"]["date"] == "2000-01-01T00:00:00"
    if rep["registry_changed"]:
        assert rep["files"]["parity"]["state"] == "stale"
    assert rep["files"]["bench"]["state"] == "missing"
    assert "no bench run recorded" in rep["files"]["bench"]["text"]
    empty = coverage.build(results_dir=str(d / "nothing"), progress=lambda m: None)
    assert {r["parity"] for r in empty["rows"]} == {"no run"}


def test_missing_lists_exactly_the_uncovered_targets(report):
    rep, _ = report
    missing = coverage.filter_rows(rep["rows"], missing=True)
    expected = set()
    for t in coverage.load_targets():
        op = overload_or_none(t["op"])
        if op is None or coverage.classify(op)["best"] == "none":
            expected.add(t["op"])
    assert {r["op"] for r in missing} == expected
    assert len(missing) == rep["totals"]["gap"]
    lines: list[str] = []
    coverage.main(["--missing", "--results", "/nonexistent"], out=lines.append)
    text = "\n".join(lines)
    assert all(op in text for op in expected)
    assert f"\n{len(expected)} rows" in text


def test_json_is_well_formed_and_filters(report, tmp_path):
    rep, d = report
    assert coverage.check_report(json.loads(json.dumps(rep, default=str))) == []
    assert coverage.check_report({"format": 1}) != []
    bad = json.loads(json.dumps(rep, default=str))
    bad["rows"][0]["best"] = "gpu"
    del bad["rows"][1]["pick"]
    errs = coverage.check_report(bad)
    assert any("best" in e for e in errs) and any("pick" in e for e in errs)
    out = tmp_path / "cov.json"
    coverage.main(["--format", "json", "--tier", "1", "--results", str(d), "-o", str(out)])
    data = json.loads(out.read_text())
    assert coverage.check_report(data) == [] and {r["tier"] for r in data["rows"]} == {"1"}
    softmax = coverage.filter_rows(rep["rows"], op="softmax")
    assert softmax and all("softmax" in r["op"] for r in softmax)
    pallas = coverage.filter_rows(rep["rows"], kind="pallas")
    assert pallas and all("pallas" in r["kinds"] for r in pallas)


def test_user_op_shows_up(report, user_op):
    rep, _ = report
    row = next(r for r in rep["rows"] if r["op"] == "covtest.scale2.default")
    assert row["tier"] == "custom" and row["best"] == "user" and row["covered"]
    assert row["pick"] == "user:scale2"


def test_flex_attention_rows(report):
    """The higher-order ops with impls get rows of their own, from the same route."""
    rows = {r["op"]: r for r in report[0]["rows"]}
    for name in ("higher_order.flex_attention", "higher_order.flex_attention_backward"):
        r = rows[name]
        assert r["tier"] == "hop" and r["covered"] and r["best"] == "pallas", r
        assert set(r["kinds"]) == {"pallas", "xla"} and r["input"] == "n/a", r
    assert report[0]["totals"]["higher_order_ops"] == 2


def test_chart_html_markdown(report, tmp_path):
    rep, d = report
    chart = tmp_path / "chart.png"
    html_path = tmp_path / "cov.html"
    coverage.main(["--chart", str(chart), "--format", "html", "-o", str(html_path), "--results", str(d)])
    assert chart.stat().st_size > 1000 and chart.read_bytes()[:4] == b"\x89PNG"
    page = html_path.read_text()
    assert "data:image/png;base64," in page and "sortBy" in page and "aten.mm.default" in page
    md = coverage.format_markdown(rep, rep["rows"][:5])
    assert md.count("\n|") >= 5


def test_speed_from_bench_json():
    bench = {"results": [
        {"op": "aten.mm.default", "case": "c", "dtype": "float32", "kind": k, "status": "ok",
         "mode": m, "median_s": t}
        for k, m, t in (("xla", "compiled", 2.0), ("pallas", "compiled", 1.0), ("torch_cpu", "torch-cpu", 4.0))]}
    ratio, text = coverage.bench_speed("aten.mm.default", bench)
    assert ratio == 2.0 and "x2.00 vs xla" in text
    bench["results"][1]["mode"] = "interpret"           # interpret runs are never speed
    ratio, text = coverage.bench_speed("aten.mm.default", bench)
    assert ratio is None and "xla x2.00 vs torch-cpu" in text


def test_model_ops_gpt():
    from tpu_kernels.models import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    tokens = torch.randint(0, model.cfg.vocab, (2, 8))
    rep = coverage.model_ops(model, tokens)
    ops = {r["op"]: r for r in rep["ops"]}
    for name in ("aten.embedding.default", "aten.mm.default", "aten.native_layer_norm.default",
                 "aten.embedding_dense_backward.default", "aten.native_layer_norm_backward.default"):
        assert name in ops, sorted(ops)
    assert "forward" in ops["aten.embedding.default"]["phases"]
    assert "backward" in ops["aten.embedding_dense_backward.default"]["phases"]
    assert ops["aten.mm.default"]["covered"] and ops["aten.mm.default"]["tier"] == "1"
    assert ops["aten.mm.default"]["pick"].startswith("xla:")     # no TPU here: kernels off
    assert rep["covered"] == sum(r["covered"] for r in rep["ops"])
    assert "aten.mm.default" in coverage.format_model_report(rep)


def make_tiny_model():
    """A ``MODULE:FACTORY`` target for the --model CLI test."""
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU()), torch.randn(2, 4)


def test_model_cli():
    lines: list[str] = []
    coverage.main(["--model", "test_coverage:make_tiny_model"], out=lines.append)
    text = "\n".join(lines)
    assert "aten.addmm.default" in text and "aten.gelu.default" in text
    assert "aten.gelu_backward.default" in text


def test_export_cell_per_chip():
    """The "compiles on" cell: each chip's verdict over the op's kernel impls; the detail
    names the compiler's reason and the VMEM."""
    ok = {"status": "ok", "reason": "", "vmem_bytes": 4 << 20, "seconds": 1.0}
    fail = {"status": "fail", "reason": "VMEM: the kernel needs 34.00M", "vmem_bytes": None}
    res = {"pallas:mm": {"chips": {"v5e": ok, "v6e": ok, "v7x": fail}},
           "helion:mm": {"chips": {"v5e": {"status": "n/a", "reason": "refuses"}, "v6e": ok,
                                   "v7x": ok}}}
    assert coverage.export_text(res) == "v5e ok v6e ok v7x FAIL"
    detail = export.export_detail(res)
    assert "pallas:mm v7x: fail: VMEM: the kernel needs 34.00M" in detail
    assert "pallas:mm v5e: ok, VMEM 4.0 MiB" in detail
    assert coverage.export_text({"pallas:mm": {"status": "ok"}}) == "not checked"  # format 1
    assert coverage.export_text({}) == "-"


@pytest.mark.skipif(aot.unavailable_reason() is not None,
                    reason="needs libtpu (the real TPU compiler)")
def test_export_check_compiles_for_each_chip(tmp_path):
    """``coverage --export-check --op`` compiles the op's kernels for v5e, v6e and v7x with
    libtpu, records export.json, and a later report reads the column from it."""
    out = tmp_path / "cov.json"
    args = ["--format", "json", "--op", "aten.mm.default", "--results", str(tmp_path), "-o", str(out)]
    coverage.main(["--export-check", *args])
    recorded = json.loads((tmp_path / "export.json").read_text())
    assert recorded["format"] == export.FORMAT
    chips = recorded["ops"]["aten.mm.default"]["pallas:mm"]["chips"]
    assert set(chips) == {"v5e", "v6e", "v7x"}
    for chip, e in chips.items():
        assert e["status"] == "ok", (chip, e)
        assert 0 < e["vmem_bytes"] <= tpu_info.chip(chip).vmem_bytes
    [row] = json.loads(out.read_text())["rows"]
    assert row["export"] == "v5e ok v6e ok v7x ok" and "VMEM" in row["export_detail"]
    coverage.main(args)                                   # no compile: the cached column
    [row] = json.loads(out.read_text())["rows"]
    assert row["export"] == "v5e ok v6e ok v7x ok"


@torch.library.custom_op("coverage_test::cpu_only", mutates_args=())
def _cpu_only(x: torch.Tensor) -> torch.Tensor:
    """An op with a CPU kernel and no tpu impl (what a model may need that tpu lacks)."""
    return x * 2


_cpu_only.register_autograd(lambda ctx, grad: grad * 2)


class _NeedsCpuOnly(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return _cpu_only(self.lin(x)) * scale


def make_model_with_missing_op():
    """A ``MODULE:FACTORY`` target with keyword inputs and an op no tpu impl runs."""
    return _NeedsCpuOnly(), {"x": torch.randn(2, 4), "scale": 0.5}


def test_model_cli_names_missing_ops():
    lines: list[str] = []
    coverage.main(["--model", "test_coverage:make_model_with_missing_op", "--format", "json"], out=lines.append)
    rep = json.loads("\n".join(lines))
    assert rep["missing"] == ["coverage_test.cpu_only.default"], rep["missing"]
    assert "aten.addmm.default" in {r["op"] for r in rep["ops"]}
