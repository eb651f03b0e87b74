"""bench/dispatch.py: --compare flags ratios more than 10% worse, and the stage split
names every stage of the hot path (a short run)."""
from __future__ import annotations

import json

from tpu_kernels.bench import dispatch, dispatch_stages, machine


def _run(*ratios: float) -> dict:
    cases = ["add 64x64", "small GPT forward", "layer_norm 512x768"]
    return {"rows": [{"case": c, "kind": "k", "ratio": r} for c, r in zip(cases, ratios)]}


def test_compare_flags_only_slowdowns_over_ten_percent():
    old = _run(2.0, 0.6, 1.0)
    new = _run(2.3, 0.65, 0.5)      # +15% (flagged), +8% (not), faster (not)
    flagged = dispatch.compare(new, old)
    assert len(flagged) == 1 and "add 64x64" in flagged[0] and "2.00 -> 2.30" in flagged[0]


def test_compare_ignores_rows_the_old_run_lacks():
    assert dispatch.compare(_run(5.0, 5.0, 5.0), {"rows": []}) == []


def test_main_compare_exits_one_on_a_slowdown(tmp_path, monkeypatch):
    monkeypatch.setattr(dispatch, "run", lambda quick, first: dict(_run(3.0, 0.6, 1.0), format=dispatch.FORMAT))
    old = tmp_path / "old.json"
    old.write_text(json.dumps(_run(2.0, 0.6, 1.0)))
    out = tmp_path / "new.json"
    assert dispatch.main(["--json", str(out), "--compare", str(old)]) == 1
    assert json.loads(out.read_text())["rows"][0]["ratio"] == 3.0
    assert dispatch.main(["--compare", str(out)]) == 0


def test_stage_split_covers_the_hot_path():
    stages = dispatch_stages.stage_split(n=20, rounds=1)
    for name in ("0 torch -> __torch_dispatch__ -> hook", "2 signature + cache lookup", "4 executable call",
                 "5 wrap results", "bare jax.jit call (floor)", "whole op (a + b)"):
        assert stages[name] >= 0.0, name
    assert stages["whole op (a + b)"] > 0.0 and stages["bare jax.jit call (floor)"] > 0.0


def test_thread_split_has_the_same_stages():
    wall = dispatch_stages.stage_split(n=5, rounds=1)
    cpu = dispatch_stages.thread_split(n=20, rounds=1)
    assert set(cpu) == set(wall)
    assert cpu["whole op (a + b)"] > 0.0 and all(v >= 0.0 for v in cpu.values())


def test_compare_notes_another_machine(tmp_path, monkeypatch, capsys):
    here = machine.describe()
    assert here["cores"] and here["cpu"] and here["backend"] == "cpu"
    assert machine.mismatch(here, dict(here)) is None
    assert "cpu 'other' ->" in machine.mismatch(here, dict(here, cpu="other"))
    assert "records no machine" in machine.mismatch(here, _run(2.0))
    monkeypatch.setattr(dispatch, "run", lambda quick, first: dict(_run(3.0, 0.6, 1.0), **here))
    old = tmp_path / "old.json"
    old.write_text(json.dumps(dict(_run(2.0, 0.6, 1.0), **dict(here, cores=64))))
    assert dispatch.main(["--compare", str(old)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("SLOWER: add 64x64") and "cores 64 ->" in lines[1]
