"""The registry's choice on a TPU is backed by numbers: a Pallas/Helion impl runs only
where its modelled time (the flops and HBM bytes its grid moves, padding included) beats
XLA's compiled estimate for the op's lowering, or, where both were measured on the chip
(``measured.json``), where it measured faster; off TPU nothing changes. Checked inside
``tpu_info.compile_for(chip)`` (kernels lower for that chip on this CPU machine), on meta
tensors: no kernel runs and nothing compiles."""
from __future__ import annotations

import functools

import pytest
import torch

import tpu_kernels  # noqa: F401  (registers the tpu device and the impls)
from tpu_kernels import registry
from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry import REGISTRY
from tpu_kernels.registry.costs import decide, kernel_model, measured, xla_table
from tpu_kernels.registry.costs.program import program


def _m(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def _impl(op_name: str, kind: str):
    return next(i for i in registry.impls(op_name) if i.kind == kind)


def test_off_tpu_the_choice_is_as_before():
    a, b = _m(520, 1100), _m(1100, 4096)
    impl, skipped = registry.which("aten::mm", a, b)
    assert impl.kind == "xla" and "no TPU" in skipped[0][1]
    with registry.interpret():                       # interpret mode: the kernel, unweighed
        impl, skipped = registry.which("aten::mm", a, b)
    assert impl.kind == "pallas" and skipped == []


def test_ragged_matmul_choice_follows_the_padding_figures():
    """m=520, k=1100 used to pad to 1024 x 2048 on v6e (~3.7x the useful flops) and lose
    to XLA; full-extent blocks now cover them and the bf16 kernel wins on its figures.
    In f32 (six bf16 MXU passes at HIGHEST) XLA still wins, and says so."""
    with tpu_info.compile_for("v6e"):
        impl, skipped = registry.which("aten::mm", _m(520, 1100), _m(1100, 4096))
        assert impl.kind == "pallas"
        [(loser, why)] = skipped
        assert loser.kind == "xla" and why.startswith("cost on v6e: pallas:mm") and "kernel" in why
        f32 = dict(dtype=torch.float32)
        impl, [(loser, why)] = registry.which("aten::mm", _m(520, 1100, **f32), _m(1100, 4096, **f32))
    assert impl.kind == "xla" and loser.kind == "pallas" and "XLA" in why


def test_modelled_matmul_counts_padding_and_refetches():
    op = registry.resolve_overload("aten::mm")
    fn, specs = program(op, _impl("aten::mm", "pallas"), (_m(520, 1100), _m(1100, 4096)), {})
    got = kernel_model.model(fn, specs, "v6e")
    useful = 2 * 520 * 1100 * 4096
    assert got.kernels == 1 and useful <= got.flops < 1.1 * useful   # edge blocks, no 2x pad
    assert got.kernel_bytes >= (520 * 1100 + 1100 * 4096 + 520 * 4096) * 2
    assert got.wrapper_bytes == 0                                 # nothing padded or sliced
    fn, specs = program(op, _impl("aten::mm", "pallas"), (_m(4096, 4096), _m(4096, 4096)), {})
    got = kernel_model.model(fn, specs, "v6e")
    assert got.kernel_bytes > 3 * 4096 * 4096 * 2                 # tiles re-read per block


def test_a_winning_kernel_names_the_xla_impl_it_beat():
    with tpu_info.compile_for("v6e"):
        impl, skipped = registry.which("aten::_fused_rms_norm", _m(8192, 4096), [4096], _m(4096), 1e-6)
    d = decide.decide(registry.resolve_overload("aten::_fused_rms_norm"), _impl("aten::_fused_rms_norm", "helion"),
                      _impl("aten::_fused_rms_norm", "xla"), (_m(8192, 4096), [4096], _m(4096), 1e-6), {}, "v6e")
    assert d is not None and d.kernel_seconds > 0 and d.xla_seconds > 0
    winner = "helion" if d.kernel_wins else "xla"
    assert impl.kind == winner
    [(other, why)] = skipped
    assert other.kind == ("xla" if d.kernel_wins else "helion") and why == d.reason()


def test_force_and_the_switch_bypass_the_cost_model():
    pallas = _impl("aten::mm", "pallas")
    a, b = _m(520, 1100, dtype=torch.float32), _m(1100, 4096, dtype=torch.float32)   # XLA wins
    with tpu_info.compile_for("v6e"):
        with REGISTRY.force(pallas):
            assert registry.which("aten::mm", a, b)[0] is pallas
        with REGISTRY.cost_model(False):
            assert registry.which("aten::mm", a, b)[0] is pallas
        assert registry.which("aten::mm", a, b)[0].kind == "xla"


def test_xla_estimates_exact_class_and_fallback(monkeypatch):
    args, kw = (_m(1000, 100), _m(100, 300)), {}
    entry_key = xla_table.key("aten::mm", "v6e", args, kw)
    assert entry_key == "aten::mm|v6e|bfloat16[1024,128] bfloat16[128,512]"
    shapes = xla_table.signature(args, kw, bucket=False)
    monkeypatch.setattr(xla_table, "table", lambda: {entry_key: {"seconds": 2e-6, "roofline": 1e-6, "shapes": shapes}})
    xla_table._efficiency.cache_clear()
    try:
        assert xla_table.estimate("aten::mm", "v6e", args, kw, 1e-6) == xla_table.Estimate(2e-6, "compiled")
        other = (_m(900, 100), _m(100, 300))        # same class, other shape: scaled
        got = xla_table.estimate("aten::mm", "v6e", other, kw, 0.9e-6)
        assert got.source == "class" and got.seconds == pytest.approx(1.8e-6)
        far = (_m(9000, 100), _m(100, 300))         # no entry: the op's median efficiency (1/2)
        assert xla_table.estimate("aten::mm", "v6e", far, kw, 4e-6) == xla_table.Estimate(8e-6, "fallback")
    finally:
        xla_table._efficiency.cache_clear()


def test_the_shipped_table_has_compiled_figures_for_the_checked_chips():
    entries = xla_table.table()
    for chip in tpu_info.CHECKED_GENERATIONS:
        assert any(k.startswith(f"aten::mm|{chip}|") for k in entries), chip
    assert all(e["seconds"] > 0 and e["roofline"] > 0 for e in entries.values())


def _measured_table(monkeypatch, rows: dict) -> None:
    """``measured.json`` replaced by ``rows`` for one test, every cache that holds it cleared."""
    monkeypatch.setattr(measured, "table", lambda: rows)
    monkeypatch.setattr(measured, "_by_class", functools.cache(measured._by_class.__wrapped__))
    monkeypatch.setattr(decide, "_CACHE", {})


def test_a_measurement_on_the_chip_decides_over_the_model(monkeypatch):
    """The model has the Pallas matmul win at the medium GPT's f32 sizes on v5e; measured
    there, XLA was faster: the measurement decides, at its shapes and for its shape class,
    with the measured ratio; a call of another class is left to the model."""
    op, f32 = registry.resolve_overload("aten::mm"), dict(dtype=torch.float32)
    args = (_m(1024, 256, **f32), _m(256, 1024, **f32))
    pallas, xla = _impl("aten::mm", "pallas"), _impl("aten::mm", "xla")
    model = decide.modelled(op, pallas, xla, args, {}, "v5e")
    assert model.kernel_wins
    row = {"op": "aten::mm", "impl": "pallas:mm", "chip": "v5e", "kernel_s": 18e-6, "xla_s": 12e-6}
    _measured_table(monkeypatch, dict([measured.entry(row, op, args, {}, model.useful_seconds)]))
    with tpu_info.compile_for("v5e"):
        impl, [(loser, why)] = registry.which("aten::mm", *args)
        assert impl is xla and loser is pallas
        assert why == "cost on v5e: pallas:mm 18.0 us, XLA 12.0 us (measured on the chip): XLA 1.50x faster"
        near = (_m(1000, 250, **f32), _m(250, 1000, **f32))      # same class: the measured ratio
        d = decide.decide(op, pallas, xla, near, {}, "v5e")
        assert d.source == "measured class" and d.xla_seconds / d.kernel_seconds == pytest.approx(12 / 18)
        assert registry.which("aten::mm", *near)[0] is xla
        far = (_m(4096, 4096, **f32), _m(4096, 4096, **f32))     # not measured: the model's figures
        assert decide.decide(op, pallas, xla, far, {}, "v5e").source in ("compiled", "class", "fallback")
    # a kernel the model cannot see (a Helion path its walk misses) is still judged by its measurement
    monkeypatch.setattr(decide, "modelled", lambda *a: None)
    monkeypatch.setattr(decide, "_CACHE", {})
    d = decide.decide(op, pallas, xla, args, {}, "v5e")
    assert (d.source, d.kernel_wins, d.modelled) == ("measured", False, None)


def test_the_shipped_measurements_are_whole():
    entries = measured.table()
    if not entries:
        pytest.skip("no measured.json shipped (bench/kernel_choice.py --write on a TPU makes it)")
    for key, e in entries.items():
        assert key == f"{e['op']}|{e['impl']}|{e['chip']}|{e['shapes']}"
        assert e["kernel_s"] > 0 and e["xla_s"] > 0 and e["ideal_s"] > 0
        assert e["chip"] in tpu_info.CHIPS
