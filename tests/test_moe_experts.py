"""``tpu_kernels::moe_experts`` (``tpu_kernels/spmd_moe.py``) and transformers'
``experts_implementation="tpu_kernels"`` (``tpu_kernels/transformers_moe.py``) on one
device: the same values and gradients as transformers' own MoE block, and the capacity
rule of the expert-parallel dispatch (its all_to_all over a one-device axis). The sharded
cases (8 CPU devices, all_to_all between them) are ``tests/spmd_cases.py``'s
``moe_expert_parallel``."""
from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import tpu_kernels  # noqa: F401
from tpu_kernels import spmd_moe, transformers_moe

pytest.importorskip("transformers")


def _block(dtype: torch.dtype):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    cfg = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=8,
                         num_experts_per_tok=2, norm_topk_prob=True)
    cfg._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    ref = Qwen3MoeSparseMoeBlock(cfg)
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ref = ref.to(dtype)
    ours = copy.deepcopy(ref)
    ours.experts.config = copy.deepcopy(cfg)
    assert transformers_moe.use(ours) == 1
    assert ours.experts.config._experts_implementation == "tpu_kernels"
    assert ref.experts.config._experts_implementation == "grouped_mm"
    return ref, ours


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_hf_block_on_tpu_equals_grouped_mm(dtype, tol):
    """Forward and backward of Qwen3-MoE's sparse block with the experts as one op (on
    tpu) against transformers' grouped_mm experts (on CPU)."""
    ref, ours = _block(dtype)
    ours = ours.to("tpu")
    x = torch.randn(2, 12, 32, dtype=dtype)
    xr, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    yr, yt = ref(xr), ours(xt)
    torch.testing.assert_close(yt.cpu(), yr, rtol=tol, atol=tol)
    g = torch.randn_like(yr)
    yr.backward(g)
    yt.backward(g.to("tpu"))
    torch.testing.assert_close(xt.grad.cpu(), xr.grad, rtol=tol, atol=tol)
    for (name, a), b in zip(ref.named_parameters(), ours.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=tol, atol=4 * tol, msg=name)


def test_cpu_reference_equals_grouped_mm():
    ref, _ = _block(torch.float32)
    x = torch.randn(24, 32)
    _, weights, index = ref.gate(x)
    e = ref.experts
    torch.testing.assert_close(
        torch.ops.tpu_kernels.moe_experts(x, index, weights, e.gate_up_proj, e.down_proj),
        e(x, index, weights), rtol=1e-5, atol=1e-5)


def test_capacity():
    # 64 tokens x top-2 over 8 experts: 16 copies per expert on average
    assert spmd_moe.capacity(64, 2, 8, 1.0) == 16
    assert spmd_moe.capacity(64, 2, 8, 1.25) == 24           # 20, rounded up to 8s
    assert spmd_moe.capacity(64, 2, 8, 4.0) == 64            # dropless: at most every token
    assert spmd_moe.capacity(64, 2, 8, 100.0) == 64


def _dropping_reference(x, index, weights, gate_up, down, cap):
    """Every token's rank-0 choice before any rank-1 choice; an expert takes its first
    ``cap`` copies; the rest contribute nothing."""
    t, k = index.shape
    taken = np.zeros(gate_up.shape[0], int)
    out = np.zeros_like(x)
    inter = gate_up.shape[1] // 2
    for r in range(k):
        for i in range(t):
            e = index[i, r]
            taken[e] += 1
            if taken[e] > cap:
                continue
            h = gate_up[e] @ x[i]
            a = h[:inter] / (1 + np.exp(-h[:inter])) * h[inter:]
            out[i] += weights[i, r] * (down[e] @ a)
    return out


def test_dispatch_drops_copies_past_capacity():
    """The dispatch on a one-device expert axis (its all_to_alls are identities) equals
    the dropless experts with room for every copy, and drops the copies past an expert's
    capacity in GShard's priority order."""
    rng = np.random.default_rng(0)
    t, h, inter, e, k = 32, 16, 8, 4, 2
    x = rng.standard_normal((t, h)).astype(np.float32)
    # a skewed router: expert 0 is most tokens' first choice
    index = np.stack([np.where(rng.random(t) < 0.7, 0, rng.integers(1, e, t)),
                      rng.integers(1, e, t)], 1).astype(np.int32)
    index[:, 1] = np.where(index[:, 1] == index[:, 0], (index[:, 0] + 1) % e, index[:, 1])
    weights = rng.random((t, k)).astype(np.float32)
    gate_up = (rng.standard_normal((e, 2 * inter, h)) * 0.3).astype(np.float32)
    down = (rng.standard_normal((e, h, inter)) * 0.3).astype(np.float32)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("ep",))
    spec = jax.sharding.PartitionSpec()

    def dispatch(cap):
        f = jax.shard_map(lambda *a: spmd_moe.experts_dispatch(*a, axes=("ep",), n=1, cap=cap),
                          mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
        return np.asarray(jax.jit(f)(x, index, weights, gate_up, down))
    dropless = np.asarray(spmd_moe.experts_dropless(*map(jnp.asarray, (x, index, weights,
                                                                        gate_up, down))))
    np.testing.assert_allclose(dispatch(t), dropless, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_dropping_reference(x, index, weights, gate_up, down, t),
                               dropless, rtol=1e-5, atol=1e-5)
    got = dispatch(8)
    assert np.abs(got - dropless).max() > 1e-2       # expert 0 is over capacity
    np.testing.assert_allclose(got, _dropping_reference(x, index, weights, gate_up, down, 8),
                               rtol=1e-5, atol=1e-5)
