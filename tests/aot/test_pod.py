"""Training steps compiled as one SPMD program for a TPU pod slice (``tpu_kernels.aot.pod``,
``python -m tpu_kernels aot --model ... --mesh ... --topology ...``).

CI compiles one small sharded program for all 256 chips of v5e:16x16 (a few seconds) and
checks the collectives analysis; the thorough profile compiles whole training steps:
the small Llama on a v5e:2x4 slice, and Llama-3-8B and Qwen3-MoE-30B shapes at one layer
on v5e:16x16 and v6e:8x8 (minutes each; the full report, scaled from compiled depths, is
bench/pod_scale.py's: docs/reports/pod_scale.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tpu_kernels import aot
from tpu_kernels.aot import collectives, configs, pod
from tpu_kernels.aot.compiler import compile_lowered

pytestmark = pytest.mark.skipif(aot.unavailable_reason() is not None,
                                reason=str(aot.unavailable_reason()))

HLO = """\
ENTRY %main (p0: bf16[64,128]) -> f32[8] {
  %all-gather-start = (bf16[16,128]{1,0}, bf16[64,128]{1,0}) all-gather-start(%p0), dimensions={0}
  %fusion.1 = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused_computation
  %all-gather-done = bf16[64,128]{1,0} all-gather-done(%all-gather-start)
  %all-reduce-start = f32[1024]{0} all-reduce-start(%y), to_apply=%add
  %all-reduce-done = f32[1024]{0} all-reduce-done(%all-reduce-start)
  %reduce-scatter = f32[256]{0} reduce-scatter(%z), dimensions={0}
  ROOT %t = f32[8]{0} copy(%fusion.1)
}
"""


def test_parse_mesh():
    assert pod.parse_mesh("fsdp=64,tp=4") == {"fsdp": 64, "tp": 4}
    with pytest.raises(ValueError, match="AXIS=SIZE"):
        pod.parse_mesh("fsdp:64")


def test_collectives_counts_bytes_and_overlap():
    r = collectives.analyse(HLO)
    assert r.by_kind() == {"all-gather": (1, 64 * 128 * 2), "all-reduce": (1, 4096),
                           "reduce-scatter": (1, 1024)}
    # only the all-gather has compute (the fusion) between its start and done
    assert r.overlapped_fraction == pytest.approx(16384 / (16384 + 4096 + 1024))


def test_a_sharded_program_compiles_for_256_chips():
    mesh, chip = pod.pod_mesh("v5e:16x16", {"fsdp": 64, "tp": 4})
    assert chip == "v5e" and mesh.size(("fsdp", "tp")) == 256
    x = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16, sharding=mesh.sharding((("fsdp", "tp"), None)))
    w = jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16, sharding=mesh.sharding(("fsdp", "tp")))
    c = compile_lowered(lambda: jax.jit(lambda a, b: jax.nn.gelu(a @ b)).lower(x, w), chip)
    r = collectives.analyse(c.as_text())
    assert "all-gather" in r.by_kind(), r.by_kind()     # w is gathered over fsdp
    # each chip holds 1/256 of x and 1/256 of w, and the output's rows
    assert c.summary.argument_bytes == (4096 * 4096 + 4096 * 8192) * 2 // 256


def test_mesh_must_cover_the_slice():
    with pytest.raises(ValueError, match="has 256"):
        pod.pod_mesh("v5e:16x16", {"fsdp": 8})


@pytest.mark.thorough
def test_small_llama_step_on_a_slice(capsys):
    from tpu_kernels.__main__ import main
    assert main(["aot", "--model", "llama-small", "--mesh", "fsdp=4,tp=2",
                 "--topology", "v5e:2x4"]) == 0
    out = capsys.readouterr().out
    assert "8 chips" in out and "all-gather" in out and "MFU" in out


@pytest.mark.thorough
def test_small_moe_step_dispatches_tokens_by_all_to_all():
    """The small Qwen3-MoE on v6e:2x4 (fsdp=2 x ep=4, ~1 min): the experts' op exchanges
    the routed copies by all_to_all; no collective carries all 8,192 routed copies of the
    4,096 tokens (transformers' grouped_mm experts gathered them on every chip)."""
    import re
    r = pod.compile_pod_step(configs.qwen3_moe_small().at_depth(1), "v6e:2x4",
                             {"fsdp": 2, "ep": 4})
    assert r.tokens == 4096 and r.comms.by_kind()["all-to-all"][0] >= 4, r.comms.by_kind()
    shapes = re.findall(r"= (\S+) (?:all-gather|all-reduce)(?:-start)?\(", r.hlo)
    assert not [s for s in shapes if re.match(r"\w+\[8192[,\]]", s)], shapes


def test_a_bundled_model_at_another_depth():
    import torch
    spec = configs.llama3_8b().at_depth(2)
    with torch.device("meta"):
        model = spec.build()
    assert spec.name == "llama3-8b-L2" and len(model.model.layers) == 2
    assert model.config.hidden_size == 4096 and spec.seq == 4096
    with pytest.raises(ValueError, match="another depth"):
        configs.gpt().at_depth(2)


def test_per_layer_figures_scale_linearly():
    from tpu_kernels.bench.pod_scale import LINEAR, scaled

    def at(layers):
        r = {f: 10.0 + 3.0 * layers for f in LINEAR}
        r.update(layers=layers, collectives={"all-gather": {"count": 2 * layers, "bytes": 100 * layers}})
        return r
    s = scaled(at(1), at(2), 32)
    assert s["temp_bytes"] == pytest.approx(10 + 3 * 32)
    assert s["collectives"]["all-gather"] == {"count": 64, "bytes": 3200}


# The pod-scale report's commands (bench/pod_scale.py, docs/spmd.md) at small depth: the
# full training step of each shape, one and two decoder layers, on each slice (minutes
# each on a 2-core machine: thorough only).
@pytest.mark.thorough
@pytest.mark.parametrize("model,topology,mesh", [
    ("llama3-8b", "v5e:16x16", "fsdp=64,tp=4"), ("llama3-8b", "v6e:8x8", "fsdp=16,tp=4"),
    ("qwen3-moe-30b", "v5e:16x16", "fsdp=64,ep=4"), ("qwen3-moe-30b", "v6e:8x8", "fsdp=16,ep=4")])
def test_pod_step_at_small_depth(model, topology, mesh, capsys):
    from tpu_kernels.__main__ import main
    code = main(["aot", "--model", model, "--layers", "1", "--mesh", mesh, "--topology", topology])
    out = capsys.readouterr().out
    assert code == 0, out          # 1: does not fit
    assert "all-gather" in out and "MFU" in out and f"{model}-L1 on {topology}" in out


@pytest.mark.thorough
def test_small_llama_step_runs_flash_attention_per_shard():
    """The small Llama (GQA 4/2, seq 256) on v5e:2x4 (fsdp=4 x tp=2, ~30 s): SDPA is the
    flash Pallas kernel per shard (forward and backward, both layers) and no chip holds
    the f32 attention scores [batch/4, heads/2, 256, 256] that XLA's attention keeps."""
    import dataclasses
    spec = dataclasses.replace(configs.llama_small(), seq=256)
    r = pod.compile_pod_step(spec, "v5e:2x4", {"fsdp": 4, "tp": 2})
    assert r.hlo.count('custom_call_target="tpu_custom_call"') >= 4, r.summary.kernels
    assert "f32[4,2,256,256]" not in r.hlo
