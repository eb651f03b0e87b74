"""A model's training step compiled for a TPU chip on this machine: its
``torch.compile(backend="tpu")`` forward and backward graphs and the fused AdamW step, on
abstract tensors (no weights are made), through ``python -m tpu_kernels aot --model``.

CI compiles the bundled GPT and the small Llama- and Qwen3-MoE-shaped models for v6e
(30-90 s each: the graphs' capture and three XLA:TPU compiles); the thorough profile
compiles Llama-3-8B's shapes in bf16 for v5e, v6e and v7x.
"""
from __future__ import annotations

import pytest

from tpu_kernels import aot
from tpu_kernels.aot import configs, training
from tpu_kernels.registry import REGISTRY

pytestmark = pytest.mark.skipif(aot.unavailable_reason() is not None,
                                reason=str(aot.unavailable_reason()))


def _check(report, kernels: set[str]):
    assert report.ok, report.failures
    kinds = [k for k, _ in report.programs]
    assert kinds == ["forward", "backward", "optimizer"], kinds
    inside = {k.name for _, s in report.programs for k in s.kernels}
    assert kernels <= inside, (kernels - inside, inside)
    for _, s in report.programs:
        assert s.argument_bytes > 0 and s.optimal_seconds > 0
        assert all(k.flops is not None for k in s.kernels)     # every kernel's cost is known
    assert 0 < report.mfu < 1 and report.peak_hbm_bytes > 0


# These check that every kernel compiles inside a real step, so they turn the cost model off
# (with it, a kernel runs only where it is modelled to beat XLA: test_cost_model_step).
def test_cli_compiles_the_bundled_gpt(capsys):
    from tpu_kernels.__main__ import main
    with REGISTRY.cost_model(False):
        assert main(["aot", "--model", "gpt", "--chip", "v6e"]) == 0
    out = capsys.readouterr().out
    assert "gpt on v6e" in out and "MFU" in out and "flash_attention_fwd" in out


def test_llama_shaped():
    with REGISTRY.cost_model(False):
        [report] = training.compile_model(configs.llama_small(), ["v6e"])
    _check(report, {"matmul", "flash_attention_fwd", "flash_attention_dq", "flash_attention_dkv",
                    "linear_cross_entropy_fwd", "embedding_gather",
                    "embedding_scatter_add", "fused_adamw"})


@pytest.mark.thorough   # 53 s in CI; gpt and llama-shaped steps stay in CI
def test_qwen3_moe_shaped():
    with REGISTRY.cost_model(False):
        [report] = training.compile_model(configs.qwen3_moe_small(), ["v6e"])
    _check(report, {"gmm", "helion_topk", "flash_attention_fwd", "fused_adamw"})


def test_a_factory_must_return_a_model_spec():
    with pytest.raises(TypeError, match="ModelSpec"):
        training.load("tpu_kernels.models:GPTConfig")
    with pytest.raises(ValueError, match="MODULE:FACTORY"):
        training.load("no-such-model")


@pytest.mark.thorough
def test_llama3_8b_shaped():
    reports = training.compile_model(configs.llama3_8b(), ["v5e", "v6e", "v7x"])
    by_chip = {r.chip: r for r in reports}
    assert by_chip["v7x"].ok, by_chip["v7x"].failures          # 96 GiB per device
    for chip in ("v5e", "v6e"):       # 16 and 32 GiB: bf16 weights, grads and states alone
        assert any(why.startswith("HBM") for _, why in by_chip[chip].failures)


@pytest.mark.thorough
def test_cost_model_step():
    """With the cost model (the default), the step keeps only kernels modelled to win, and
    XLA's estimate of the step is no slower than with every kernel forced in."""
    [chosen] = training.compile_model(configs.llama_small(), ["v6e"])
    with REGISTRY.cost_model(False):
        [every] = training.compile_model(configs.llama_small(), ["v6e"])
    assert chosen.ok and every.ok
    names = {k.name for _, s in chosen.programs for k in s.kernels}
    assert names <= {k.name for _, s in every.programs for k in s.kernels}
    assert "matmul" not in names            # XLA's dot wins every matmul shape class on v6e
    assert sum(s.optimal_seconds for _, s in chosen.programs) <= sum(s.optimal_seconds for _, s in every.programs)
