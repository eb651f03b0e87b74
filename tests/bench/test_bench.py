"""`python -m tpu_kernels bench`: the --quick run (in-process), FLOP/byte formulas against hand
counts, roofline arithmetic, the peak tables' units, filters and --compare."""
from __future__ import annotations

import json

import pytest
import torch

from tpu_kernels.bench import peaks, report, runner
from tpu_kernels.bench.spec import case
from tpu_kernels.pallas import tpu_info


def _bench(name):
    return next(b for b in runner.load_benchmarks() if b.name == name)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    lines: list[str] = []
    run = runner.run(quick=True, json_path=str(d / "bench.json"), plots=str(d / "plots"),
                     out=lines.append, progress=lambda m: None)
    return run, d, lines


def test_quick_run_writes_valid_json(quick_run):
    run, d, lines = quick_run
    data = json.loads((d / "bench.json").read_text())
    assert data["format"] == runner.FORMAT and data["date"][:4].isdigit()
    assert data["device_peak"]["flops"] > 0 and data["cpu_peak"]["source"] == "measured"
    assert "dispatch overhead" in data["note"]
    rows = data["results"]
    quick_pairs = runner.select(runner.load_benchmarks(), quick=True)
    assert {(b.name, c.label) for b, c in quick_pairs} == {(r["kernel"], r["case"]) for r in rows}
    for r in rows:
        for key in ("kernel", "op", "case", "dims", "dtype", "impl", "kind", "status", "flops", "bytes"):
            assert key in r, key
        assert r["status"] in ("ok", "skipped", "error")
        if r["status"] == "ok" and r["mode"] != "interpret":
            assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"]
            assert r["compile_s"] >= 0 and r["n"] >= 3
            assert r["bytes_s"] == pytest.approx(r["bytes"] / r["median_s"])
        if r["mode"] == "interpret":      # never reported as speed
            assert r.get("flop_s") is None and r.get("peak_fraction") is None
    assert not [r for r in rows if r["status"] == "error"], [r for r in rows if r["status"] == "error"]
    assert not [r for r in rows if (r.get("check") or {}).get("ok") is False]
    # torch on the CPU and the XLA lowering of mm were both timed
    mm = [r for r in rows if r["kernel"] == "mm" and r["status"] == "ok"]
    assert {"torch_cpu", "xla"} <= {r["kind"] for r in mm}
    assert any("XLA lowering vs torch CPU" in line for line in lines)
    assert (d / "plots" / "roofline.png").stat().st_size > 0
    assert (d / "plots" / "mm.png").stat().st_size > 0


def test_compare_against_earlier_run(quick_run, tmp_path):
    run, d, _ = quick_run
    lines: list[str] = []
    again = runner.run(kernel="mm", shape="m128", quick=True, json_path=None, plots=None,
                       compare=str(d / "bench.json"), out=lines.append, progress=lambda m: None)
    timed = [r for r in again["results"] if r["status"] == "ok"]
    assert timed and all(r["compare_ratio"] > 0 for r in timed)
    assert any(line.startswith("vs earlier run") for line in lines)
    assert not any("another machine" in line or "records no machine" in line for line in lines)   # the same one
    elsewhere = json.loads((d / "bench.json").read_text())
    elsewhere["cores"] = 96
    (tmp_path / "elsewhere.json").write_text(json.dumps(elsewhere))
    lines.clear()
    runner.run(kernel="mm", shape="m128", quick=True, json_path=None, plots=None,
               compare=str(tmp_path / "elsewhere.json"), out=lines.append, progress=lambda m: None)
    assert any(line.startswith("note: the earlier run was on another machine (cores 96 ->") for line in lines)


def test_flop_and_byte_formulas_hand_counts():
    mm, c = _bench("mm"), case(m=2, k=3, n=4)
    assert mm.flops(c) == 48 and mm.bytes(c) == 4 * (6 + 12 + 8)
    emb = _bench("embedding")
    c = case(n=5, vocab=10, dim=3)
    assert emb.flops(c) == 0
    assert emb.bytes(c) == 4 * (5 * 3 * 2) + 8 * 5              # rows read + written, int64 idx
    bwd = _bench("embedding_dense_backward")
    assert bwd.flops(c) == 15
    assert bwd.bytes(c) == 4 * (15 + 30) + 8 * 5                 # grad read, whole table written
    ce = _bench("cross_entropy")
    c = case(n=4, vocab=7, dtype=torch.bfloat16)
    assert ce.flops(c) == 4 * 28
    assert ce.bytes(c) == 2 * (28 + 1) + 8 * 4
    adam = _bench("fused_adamw")
    c = case(tensors=2, numel=10)
    assert adam.flops(c) == 15 * 20 and adam.bytes(c) == 4 * 7 * 20 + 4 * 2


def test_rates_and_roofline_fraction():
    peak = peaks.Peak("test", flops=100.0, bytes_per_s=10.0, source="table")
    assert peak.attainable(2.0) == 20.0 and peak.attainable(50.0) == 100.0
    b, c = _bench("mm"), case(m=2, k=3, n=4)                   # 48 FLOP, 104 B
    r = runner._result(b, c, "xla:mm", "xla", median_s=2.0, mode="compiled")
    runner._add_rates(r, peak)
    assert r["flop_s"] == 24.0 and r["bytes_s"] == 52.0
    assert r["peak_fraction"] == pytest.approx(24.0 / (48 / 104 * 10.0))
    r = runner._result(b, c, "pallas:mm", "pallas", median_s=2.0, mode="interpret")
    runner._add_rates(r, peak)
    assert r["flop_s"] is None and r["peak_fraction"] is None


def test_peak_table_units():
    MiB = 1024 * 1024
    for chip in tpu_info.CHIPS.values():
        assert 1e13 <= chip.bf16_flops <= 1e16, chip           # FLOP/s, not TFLOP/s
        assert 1e11 <= chip.hbm_bytes_per_s <= 1e13, chip      # B/s, not GB/s
        assert 4 * MiB <= chip.scoped_vmem_bytes <= chip.vmem_bytes <= 1024 * MiB, chip  # bytes
        assert chip.vmem_bytes % 1024 == 0 and chip.mxu in (128, 256)
        assert 8 * 1024 * MiB <= chip.hbm_bytes <= 1024 * 1024 * MiB
    assert {"v4", "v5e", "v5p", "v6e", "v7x"} <= set(tpu_info.CHIPS)
    assert {"H100", "H200"} <= set(tpu_info.GPUS)
    for gpu in tpu_info.GPUS.values():
        assert 1e13 <= gpu.bf16_flops <= 1e16 and 1e11 <= gpu.hbm_bytes_per_s <= 1e13, gpu
        assert 16 * 1024 <= gpu.smem_bytes <= 1 * MiB
    for name in ("v5e", "H200"):
        p = peaks.table_peak(name)
        assert p.source == "table" and p.flops > 1e13
    cpu = peaks.cpu_peak()
    assert 1e8 <= cpu.flops <= 1e14 and 1e8 <= cpu.bytes_per_s <= 1e13


def test_filters():
    benches = runner.load_benchmarks()
    pairs = runner.select(benches, kernel="mm", dtype="bf16")
    assert pairs and {b.name for b, _ in pairs} == {"mm"}
    assert all(c.dtype == torch.bfloat16 for _, c in pairs)
    assert all("vocab32000" in c.label for _, c in runner.select(benches, shape="vocab32000"))
    assert runner.impl_wanted("xla:mm", "xla", ["xla"]) and runner.impl_wanted("torch_cpu", "torch_cpu", ["cpu"])
    assert not runner.impl_wanted("pallas:mm", "pallas", ["xla", "cpu"])
    with pytest.raises(SystemExit):
        runner.select(benches, kernel="no_such_kernel")
    r = {"kernel": "mm", "case": "m1", "dtype": "float32", "impl": "xla:mm", "median_s": 2.0}
    report.attach_compare(r, {"results": [dict(r, median_s=1.0)]})
    assert r["compare_ratio"] == 2.0
