"""Training steps compiled as one SPMD program for a TPU pod slice (``tpu_kernels.aot.pod``,
``python -m tpu_kernels aot --model ... --mesh ... --topology ...``).

CI compiles one small sharded program for all 256 chips of v5e:16x16 (a few seconds) and
checks the collectives analysis; the thorough profile compiles whole training steps:
the small Llama on a v5e:2x4 slice, and Llama-3-8B and Qwen3-MoE-30B shapes on v5e:16x16
and v6e:8x8 (minutes each; their output is in bench/results/pod_scale.txt).
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
@pytest.mark.parametrize("topology,mesh", [("v5e:16x16", "fsdp=64,tp=4"), ("v6e:8x8", "fsdp=16,tp=4")])
def test_llama3_8b_on_a_pod(topology, mesh):
    r = pod.compile_pod_step(configs.llama3_8b(), topology, pod.parse_mesh(mesh))
    assert r.fits and 0 < r.mfu < 1 and r.comms.total_bytes > 0, r.format()
