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
from tpu_kernels.aot import collectives, configs, overlap, pod
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


# libtpu's async collective fusion (trimmed from a v5e:2x2 compile): the all-gather is
# started by a fusion rooted at AsyncCollectiveStart, continues in a fusion that also runs
# a convolution (the all-gather again in its body: the same collective), and ends at an
# AsyncCollectiveDone fusion; the reduce-scatter is an all-reduce-scatter fusion
FUSED = """\
%start_body (p0: bf16[512,2048]) -> (bf16[512,2048], bf16[2048,2048], u32[]) {
  %p0 = bf16[512,2048]{1,0} parameter(0)
  %all-gather.1 = bf16[2048,2048]{1,0} all-gather(%p0), channel_id=3, dimensions={0}, backend_config={"async_collective_fusion_config":{"flag_start":"-1","flag_end":"-1"}}
  ROOT %custom-call.1 = (bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[]) custom-call(%all-gather.1), custom_call_target="AsyncCollectiveStart"
}

%async_collective_fusion.2 (q0: bf16[512,2048], q1: bf16[2048,2048], q2: u32[], q3: bf16[2048,2048], q4: bf16[2048,2048]) -> (bf16[2048,2048], bf16[512,2048], bf16[2048,2048], u32[]) {
  %q3 = bf16[2048,2048]{1,0} parameter(3)
  %q4 = bf16[2048,2048]{1,0} parameter(4)
  %convolution.1 = bf16[2048,2048]{1,0} convolution(%q3, %q4), dim_labels=bf_io->bf
  %q0 = bf16[512,2048]{1,0} parameter(0)
  %all-gather.2 = bf16[2048,2048]{1,0} all-gather(%q0), channel_id=3, dimensions={0}, backend_config={"async_collective_fusion_config":{"flag_start":"2","flag_end":"2"}}
  %q2 = u32[] parameter(2)
  ROOT %tuple.1 = (bf16[2048,2048]{1,0}, bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[]) tuple(%convolution.1, %q0, %all-gather.2, %q2)
}

%done_body (r0: bf16[512,2048], r1: bf16[2048,2048], r2: u32[]) -> bf16[2048,2048] {
  %r0 = bf16[512,2048]{1,0} parameter(0)
  %all-gather.3 = bf16[2048,2048]{1,0} all-gather(%r0), channel_id=3, dimensions={0}, backend_config={"async_collective_fusion_config":{"flag_start":"2","flag_end":"2"}}
  %r2 = u32[] parameter(2)
  ROOT %custom-call.2 = bf16[2048,2048]{1,0} custom-call(%r0, %all-gather.3, %r2), custom_call_target="AsyncCollectiveDone"
}

%all-reduce-scatter (input: f32[2048,2048]) -> f32[512,2048] {
  %input = f32[2048,2048]{1,0} parameter(0)
  %all-reduce.1 = f32[2048,2048]{1,0} all-reduce(%input), channel_id=4, to_apply=%add
  ROOT %dynamic-slice.1 = f32[512,2048]{1,0} dynamic-slice(%all-reduce.1, %c, %c), dynamic_slice_sizes={512,2048}
}

ENTRY %main (a: bf16[512,2048], x: bf16[2048,2048], w: bf16[2048,2048]) -> bf16[2048,2048] {
  %a = bf16[512,2048]{1,0} parameter(0)
  %x = bf16[2048,2048]{1,0} parameter(1)
  %w = bf16[2048,2048]{1,0} parameter(2)
  %async-collective-start = (bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[]) fusion(%a), kind=kCustom, calls=%start_body
  %gte.0 = bf16[512,2048]{1,0} get-tuple-element(%async-collective-start), index=0
  %gte.1 = bf16[2048,2048]{1,0} get-tuple-element(%async-collective-start), index=1
  %gte.2 = u32[] get-tuple-element(%async-collective-start), index=2
  %fusion.2 = (bf16[2048,2048]{1,0}, bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[]) fusion(%gte.0, %gte.1, %gte.2, %x, %w), kind=kOutput, calls=%async_collective_fusion.2
  %gte.3 = bf16[2048,2048]{1,0} get-tuple-element(%fusion.2), index=0
  %gte.4 = bf16[512,2048]{1,0} get-tuple-element(%fusion.2), index=1
  %gte.5 = bf16[2048,2048]{1,0} get-tuple-element(%fusion.2), index=2
  %gte.6 = u32[] get-tuple-element(%fusion.2), index=3
  %async-collective-done = bf16[2048,2048]{1,0} fusion(%gte.4, %gte.5, %gte.6), kind=kCustom, calls=%done_body
  %rs = f32[512,2048]{1,0} fusion(%gte.3), kind=kCustom, calls=%all-reduce-scatter
  ROOT %out = bf16[2048,2048]{1,0} add(%async-collective-done, %async-collective-done)
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


def test_async_collective_fusion_is_one_overlapped_collective():
    r = collectives.analyse(FUSED)
    # one all-gather (not one per fusion body it appears in), one reduce-scatter
    assert r.by_kind() == {"all-gather": (1, 2048 * 2048 * 2),
                           "reduce-scatter": (1, 512 * 2048 * 4)}    # by its result
    assert r.overlap_by_kind()["all-gather"] == dict(overlapped=2048 * 2048 * 2,
                                                     async_idle=0, synchronous=0)
    assert r.overlap_by_kind()["reduce-scatter"]["synchronous"] == 512 * 2048 * 4
    # with nothing computing between start and done, the pair is async but idle
    idle = FUSED.replace("%convolution.1 = bf16[2048,2048]{1,0} convolution(%q3, %q4), "
                         "dim_labels=bf_io->bf", "%convolution.1 = bf16[2048,2048]{1,0} "
                         "bitcast(%q3)")
    assert collectives.analyse(idle).overlap_by_kind()["all-gather"]["async_idle"] > 0


def test_a_continuation_in_a_loop_body_belongs_to_its_chain():
    """libtpu's windowed einsums carry an async collective chain of the entry through a
    while loop: the continuation fusions in the loop body are the entry's all-gather, not
    one synchronous all-gather each (they were, and a Llama-3-8B v6e step counted ten
    256 MiB all-gathers that were one)."""
    looped = FUSED.replace(
        "ENTRY %main", "%loop_cond (c: (bf16[512,2048], bf16[2048,2048], u32[], bf16[2048,2048], "
        "bf16[2048,2048])) -> pred[] {\n  %c = (bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[], "
        "bf16[2048,2048]{1,0}, bf16[2048,2048]{1,0}) parameter(0)\n  ROOT %k = pred[] constant(true)\n}\n\n"
        "%loop_body (b: (bf16[512,2048], bf16[2048,2048], u32[], bf16[2048,2048], bf16[2048,2048])) -> "
        "(bf16[512,2048], bf16[2048,2048], u32[], bf16[2048,2048], bf16[2048,2048]) {\n"
        "  %b = (bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[], bf16[2048,2048]{1,0}, bf16[2048,2048]{1,0}) parameter(0)\n"
        "  %b0 = bf16[512,2048]{1,0} get-tuple-element(%b), index=0\n"
        "  %b1 = bf16[2048,2048]{1,0} get-tuple-element(%b), index=1\n"
        "  %b2 = u32[] get-tuple-element(%b), index=2\n"
        "  %b3 = bf16[2048,2048]{1,0} get-tuple-element(%b), index=3\n"
        "  %b4 = bf16[2048,2048]{1,0} get-tuple-element(%b), index=4\n"
        "  %cont.1 = (bf16[2048,2048]{1,0}, bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[]) fusion(%b0, %b1, %b2, %b3, %b4), "
        "kind=kOutput, calls=%async_collective_fusion.2\n"
        "  %cont.2 = (bf16[2048,2048]{1,0}, bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[]) fusion(%b0, %b1, %b2, %b3, %b4), "
        "kind=kOutput, calls=%async_collective_fusion.2\n"
        "  ROOT %bt = (bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[], bf16[2048,2048]{1,0}, bf16[2048,2048]{1,0}) "
        "tuple(%b0, %b1, %b2, %b3, %b4)\n}\n\nENTRY %main")
    looped = looped.replace(
        "  %fusion.2 = (bf16[2048,2048]{1,0}, bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[]) "
        "fusion(%gte.0, %gte.1, %gte.2, %x, %w), kind=kOutput, calls=%async_collective_fusion.2\n",
        "  %tup = (bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[], bf16[2048,2048]{1,0}, bf16[2048,2048]{1,0}) "
        "tuple(%gte.0, %gte.1, %gte.2, %x, %w)\n"
        "  %loop = (bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[], bf16[2048,2048]{1,0}, bf16[2048,2048]{1,0}) "
        "while(%tup), condition=%loop_cond, body=%loop_body\n"
        "  %fusion.2 = (bf16[2048,2048]{1,0}, bf16[512,2048]{1,0}, bf16[2048,2048]{1,0}, u32[]) "
        "fusion(%gte.0, %gte.1, %gte.2, %x, %w), kind=kOutput, calls=%async_collective_fusion.2\n")
    assert "%loop_body" in looped and "while(%tup)" in looped
    r = collectives.analyse(looped)
    assert r.by_kind()["all-gather"] == (1, 2048 * 2048 * 2)
    assert r.overlap_by_kind()["all-gather"]["overlapped"] == 2048 * 2048 * 2


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


def _fsdp_chain_step(topology: str, async_collectives: bool) -> collectives.Report:
    """A tiny FSDP training step (three bf16 matmul layers, weights and batch sharded over
    4 chips, SGD) compiled for ``topology``: its collectives."""
    mesh, chip = pod.pod_mesh(topology, {"fsdp": 4})
    rows = mesh.sharding(("fsdp", None))

    def loss(ws, x):
        for w in ws:
            x = jax.nn.gelu(x @ w)
        return jnp.mean(jnp.square(x.astype(jnp.float32)))

    def step(ws, x):
        grads = jax.grad(loss)(ws, x)
        return [w - 1e-3 * g for w, g in zip(ws, grads)]
    ws = [jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=rows) for _ in range(3)]
    x = jax.ShapeDtypeStruct((2048, 1024), jnp.bfloat16, sharding=rows)
    jitted = jax.jit(step, out_shardings=[rows] * 3, donate_argnums=0)
    c = compile_lowered(lambda: jitted.lower(ws, x), chip,
                        overlap.compiler_options(async_collectives))
    return collectives.analyse(c.as_text())


def test_pod_options_overlap_collectives_with_compute():
    # v6e: libtpu's defaults run these collectives synchronously; with the pod step's
    # options the weight all-gathers (and gradient reduce-scatters) are async collective
    # fusions with the next layer's matmul in flight
    r = _fsdp_chain_step("v6e:2x2", async_collectives=True)
    by_kind = r.overlap_by_kind()
    assert by_kind["all-gather"]["overlapped"] > 0, by_kind
    assert r.overlapped_fraction > 0.5, by_kind


@pytest.mark.thorough
def test_without_the_options_nothing_overlaps_on_v6e():
    r = _fsdp_chain_step("v6e:2x2", async_collectives=False)
    assert r.total_bytes > 0 and r.overlapped_bytes == 0, r.overlap_by_kind()


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


def test_small_llama_step_gathers_weights_not_activations():
    """The small Llama's step on v5e:2x4 (fsdp=4 x tp=2, ~15 s): the LM head is laid out
    vocab-parallel, and no activation is all-gathered: attention's outputs and gradients
    (torch's strides follow the query's [batch, seq, heads, dim] layout) stay sharded over
    heads; their storages were once laid out flat, which XLA could only gather whole."""
    import re
    from tpu_kernels.aot.training import build
    model, _ = build(configs.llama_small())
    mesh, _ = pod.pod_mesh("v5e:2x4", {"fsdp": 4, "tp": 2})
    pod.shard_model(model, mesh)
    assert tuple(model.lm_head.weight._tpu_storage.array.sharding.spec) == ("tp", "fsdp")
    r = pod.compile_pod_step(configs.llama_small(), "v5e:2x4", {"fsdp": 4, "tp": 2})
    gathered = re.findall(r"= (\w+\[[\d,]*\])\S* all-gather(?:-start)?\(", r.hlo)
    assert gathered and all(s.count(",") == 1 for s in gathered), gathered   # weights only


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


def _saved_activation_bytes(remat: bool) -> int:
    """Bytes the small Llama's forward graph keeps for its backward, parameters aside."""
    import math

    import torch
    from tpu_kernels.aot import graphs, remat as remat_
    from tpu_kernels.aot.training import build
    spec = configs.llama_small()
    model, tokens = build(spec)
    if remat:
        remat_.checkpoint_layers(model)
    params = {tuple(p.shape) for p in model.parameters()}
    _, bw = graphs.capture(spec.loss, model, tokens)
    return sum(math.prod(t.shape) * t.element_size() for t in bw.example_inputs
               if isinstance(t, torch.Tensor) and tuple(t.shape) not in params)


def test_remat_keeps_less_for_the_backward():
    # each checkpointed layer keeps its input (and attention's outputs) instead of every
    # activation: the backward graph recomputes the rest
    full, kept = _saved_activation_bytes(False), _saved_activation_bytes(True)
    assert kept < full / 3, (kept, full)


def test_remat_needs_a_model_that_supports_it():
    import torch
    from tpu_kernels.aot import remat
    with pytest.raises(ValueError, match="--remat"):
        remat.checkpoint_layers(torch.nn.Linear(2, 2))


def test_per_layer_figures_scale_linearly():
    from tpu_kernels.bench.pod_scale import LINEAR, scaled

    def at(layers):
        r = {f: 10.0 + 3.0 * layers for f in LINEAR}
        r.update(layers=layers, collectives={"all-gather": {"count": 2 * layers, "bytes": 100 * layers}})
        return r
    s = scaled(at(1), at(2), 32)
    assert s["temp_bytes"] == pytest.approx(10 + 3 * 32)
    assert s["collectives"]["all-gather"] == {"count": 64, "bytes": 3200}
    assert s["shrunk"] == []


def test_a_figure_that_fell_with_depth_is_not_extrapolated_downwards():
    from tpu_kernels.bench.pod_scale import LINEAR, scaled
    lo = {f: 10.0 for f in LINEAR} | {"layers": 1, "collectives": {}}
    hi = {f: 12.0 for f in LINEAR} | {"layers": 2, "collectives": {}, "temp_bytes": 8.0}
    s = scaled(lo, hi, 48)
    assert s["temp_bytes"] == 8.0          # kept at the deeper compile's value: a lower bound
    assert s["argument_bytes"] == pytest.approx(12 + 46 * 2)
    assert s["shrunk"] == ["temp_bytes"]


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
