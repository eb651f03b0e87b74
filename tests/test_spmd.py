"""``tpu_kernels.spmd`` over 8 CPU devices: each case runs ``tests/spmd_cases.py`` in a
fresh process (``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set before
jax starts), bounded in time.

CI runs the API case (sharded eager ops, torch.compile and deferred programs, errors;
~15 s) and the GPT trained with FSDP over 8 devices (5 AdamW steps equal to unsharded
training, each device holding 1/8 of every parameter and AdamW moment; ~40 s on an idle
2-core machine: the one end-to-end proof of the SPMD training path). The 2-D (fsdp x tp)
and expert-sharded MoE trainings (``moe_experts``: ~110 s on the loaded 2-core machine),
the compiled and deferred variants, and Pallas kernels run per shard (``spmd.per_shard``:
flash attention over heads, a grouped matmul over experts; ~75 s) are thorough. The
dispatcher's own route to those kernels on sharded tensors (``spmd_kernels``: partitioned
per shard by XLA) is checked in CI at small shapes, and so is the expert-parallel MoE
op (``moe_expert_parallel``: transformers' Qwen3-MoE trained with all_to_all dispatch over
"ep" equals one device; ~90 s on the loaded machine).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

CASES = os.path.join(os.path.dirname(__file__), "spmd_cases.py")


def _run(case: str, *args: str, timeout: int = 900) -> str:
    env = dict(os.environ, JAX_PLATFORMS="cpu")   # spmd_cases.py sets its 8 devices itself
    p = subprocess.run([sys.executable, CASES, case, *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    assert p.returncode == 0 and f"ok {case}" in p.stdout, p.stdout[-3000:] + p.stderr[-6000:]
    return p.stdout


def test_sharded_tensors_eager_compiled_deferred():
    _run("api")


def test_many_sharded_programs_in_flight_finish():
    _run("many_in_flight", timeout=300)


def test_gpt_fsdp_over_8_devices_trains_like_one():
    _run("gpt_fsdp")


@pytest.mark.thorough
@pytest.mark.parametrize("mode", ["compiled", "deferred"])
def test_gpt_fsdp_modes(mode):
    _run("gpt_fsdp", mode)


@pytest.mark.thorough
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_gpt_fsdp_x_tp(mode):
    _run("gpt_2d", mode)


@pytest.mark.thorough
def test_moe_expert_sharding():
    _run("moe_experts")


def test_moe_expert_parallel_step_equals_unsharded():
    """Qwen3-MoE (transformers, experts_implementation="tpu_kernels") trained with the
    experts over "ep" and tokens over ("fsdp", "ep"): equal to one device; its MoE op
    exchanges tokens by all_to_all and gathers no tokens."""
    _run("moe_expert_parallel")


def test_dispatched_kernels_run_per_shard():
    """F.scaled_dot_product_attention (forward, backward) and torch._grouped_mm on tpu
    tensors sharded over heads / experts reach the Pallas kernels per shard (~7 s CPU)."""
    _run("dispatch_per_shard")


def test_attention_parallel_equals_unsharded():
    """Flash attention under ``spmd_kernels.attention_parallel`` (the pod step's
    shard_map over batch x heads, GQA): forward and gradients equal one device."""
    _run("attention_parallel", timeout=300)


@pytest.mark.thorough
def test_pallas_kernels_per_shard():
    _run("pallas_per_shard")
