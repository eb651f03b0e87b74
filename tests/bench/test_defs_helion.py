"""Benchmark definitions for the Helion-served ops: formulas against hand counts, and the
quick cases' args accepted by the torch ops (custom ops checked for shapes only)."""
import pytest
import torch

from tpu_kernels.bench.defs import helion as H
from tpu_kernels.bench.spec import case


def _bench(name):
    return next(b for b in H.BENCHMARKS if b.name == name)


def test_rms_norm_counts():
    b, c = _bench("helion_rms_norm"), case(t=2, h=3)
    assert b.flops(c) == 4 * 2 * 3
    assert b.bytes(c) == 4 * (2 * 6 + 3) + 4 * 2              # x, out, weight; f32 rstd
    assert b.bytes(case(t=2, h=3, dtype=torch.bfloat16)) == 2 * 15 + 8


def test_layer_norm_softmax_swiglu_counts():
    c = case(t=2, h=3)
    assert _bench("helion_layer_norm").flops(c) == 7 * 6
    assert _bench("helion_layer_norm").bytes(c) == 4 * (12 + 6) + 4 * 4
    c = case(t=2, v=5, dtype=torch.bfloat16)
    assert _bench("helion_softmax").flops(c) == 5 * 10
    assert _bench("helion_log_softmax").bytes(c) == 2 * 20
    c = case(t=2, f=4)
    assert _bench("helion_swiglu").flops(c) == 6 * 8
    assert _bench("helion_swiglu").bytes(c) == 4 * 24


def test_topk_rope_counts():
    c = case(t=2, v=10, k=3)
    assert _bench("helion_topk").bytes(c) == 4 * (20 + 6) + 8 * 6
    c = case(b=1, h=2, s=3, d=4)
    assert _bench("helion_rope").flops(c) == 3 * 2 * 24
    assert _bench("helion_rope").bytes(c) == 4 * (4 * 24 + 2 * 12)


def test_ops_and_quick_cases():
    ops = {b.op for b in H.BENCHMARKS}
    assert {"aten::_fused_rms_norm", "aten::native_layer_norm", "aten::_softmax", "aten::_log_softmax",
            "tpu_kernels::swiglu", "aten::var_mean.correction", "aten::cumsum", "aten::topk",
            "tpu_kernels::rope"} <= ops
    for b in H.BENCHMARKS:
        assert any(c.quick for c in b.cases) and any(not c.quick for c in b.cases)


@pytest.mark.parametrize("b", [b for b in H.BENCHMARKS if b.op.startswith("aten::")], ids=lambda b: b.name)
def test_quick_args_run_on_torch(b):
    op = b.overload()
    for c in b.cases:
        if c.quick:
            args, kwargs = b.make_args(c)
            op(*args, **kwargs)


def test_custom_op_args_shapes():
    c = next(c for c in _bench("helion_rope").cases if c.quick)
    q, k, cos, sin = _bench("helion_rope").make_args(c)[0]
    assert q.shape == k.shape == (c["b"], c["h"], c["s"], c["d"]) and cos.shape == sin.shape == (c["s"], c["d"])
    c = next(c for c in _bench("helion_swiglu").cases if c.quick)
    a, g = _bench("helion_swiglu").make_args(c)[0]
    assert a.shape == g.shape == (c["t"], c["f"])
