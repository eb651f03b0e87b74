"""FLOP and byte formulas of the cross-entropy, linear-CE, embedding and fused-Adam benchmarks
against hand counts, and that each case's args build."""
from __future__ import annotations

import importlib

import pytest
import torch

from tpu_kernels.bench.spec import KernelBench, case

MODULES = ["cross_entropy", "linear_cross_entropy", "embedding", "fused_adam"]


def _benches(name):
    try:
        mod = importlib.import_module(f"tpu_kernels.bench.defs.{name}")
    except ModuleNotFoundError:
        pytest.skip(f"bench/defs/{name}.py not written yet")
    return mod.BENCHMARKS


@pytest.mark.parametrize("name", MODULES)
def test_declared(name):
    for b in _benches(name):
        assert isinstance(b, KernelBench)
        assert b.overload() is not None   # the registry resolves the name
        assert any(c.quick for c in b.cases) and any(not c.quick for c in b.cases)
        for c in b.cases:
            assert b.flops(c) >= 0 and b.bytes(c) > 0
        for c in b.cases:
            if c.quick:
                args, kwargs = b.make_args(c)
                assert all(not isinstance(a, torch.Tensor) or a.device.type == "cpu" for a in args)


def test_cross_entropy_counts():
    (b,) = _benches("cross_entropy")
    c = case(n=4, vocab=10, dtype=torch.bfloat16)
    assert b.flops(c) == 4 * 4 * 10
    assert b.bytes(c) == 2 * (40 + 1) + 8 * 4
    (logits, target), kw = b.make_args(case(n=3, vocab=7))
    assert logits.shape == (3, 7) and target.dtype == torch.int64 and kw["reduction"] == "mean"


def test_embedding_counts():
    fwd, bwd = _benches("embedding")
    c = case(n=3, vocab=10, dim=4, dtype=torch.bfloat16)
    assert fwd.flops(c) == 0 and fwd.bytes(c) == 2 * (2 * 3 * 4) + 8 * 3
    assert bwd.flops(c) == 12 and bwd.bytes(c) == 2 * (12 + 40) + 8 * 3
    (grad, idx, num_weights, padding_idx, scale), _ = bwd.make_args(c)
    assert grad.shape == (3, 4) and idx.max() < 10 and num_weights == 10 and padding_idx == -1


def test_fused_adam_counts():
    (b,) = _benches("fused_adam")
    c = case(tensors=2, numel=5, dtype=torch.bfloat16)
    assert b.flops(c) == 15 * 10
    assert b.bytes(c) == 2 * 7 * 10 + 4 * 2
    (p, g, m, v, vmax, steps), kw = b.make_args(c)
    assert len(p) == 2 and p[0].shape == (5,) and vmax == [] and steps[0].dtype == torch.float32
    assert kw["amsgrad"] is False and kw["lr"] == 1e-3


def test_linear_cross_entropy_counts():
    (b,) = _benches("linear_cross_entropy")
    c = case(n=2, h=3, vocab=5, dtype=torch.bfloat16)
    assert b.flops(c) == 2 * 2 * 3 * 5 + 4 * 2 * 5
    assert b.bytes(c) == 2 * (6 + 15 + 1) + 8 * 2
    (hid, w, t), kw = b.make_args(c)
    assert hid.shape == (2, 3) and w.shape == (5, 3) and t.shape == (2,)
