"""F.scaled_dot_product_attention and F.cross_entropy reach one fused op on tpu."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import check
from tpu_kernels import dispatch, registry

CASES = {
    "causal": (dict(is_causal=True), 4),
    "gqa": (dict(is_causal=True, enable_gqa=True), 2),
    "bool_mask": (dict(attn_mask=torch.rand(33, 40) > 0.3), 4),
    "additive_mask": (dict(attn_mask=torch.randn(2, 1, 33, 40), scale=0.3), 4),
}


def _sdpa_inputs(kv_heads):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 33, 64, requires_grad=True)
    k = torch.randn(2, kv_heads, 40, 64, requires_grad=True)
    v = torch.randn(2, kv_heads, 40, 64, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("kind", ["xla", "pallas"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_sdpa_fused_matches_cpu(case, kind):
    kw, kv_heads = CASES[case]
    fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    before = dispatch.op_counts().get((str(fused), kind), 0)

    def attention(q, k, v):
        extra = {n: (t.to(q.device) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
        return F.scaled_dot_product_attention(q, k, v, **extra)
    ctx = registry.interpret() if kind == "pallas" else registry.only("xla")
    with ctx:
        # online softmax (blocked exp/sum) vs torch's two-pass one: gradients sum over
        # 40 keys and 33 queries in another order, ~1e-5 absolute at these magnitudes
        check(attention, *_sdpa_inputs(kv_heads), grad=True, atol=2e-5, rtol=1e-4)
    assert dispatch.op_counts().get((str(fused), kind), 0) > before, f"{kind} flash attention did not run"


def test_sdpa_with_dropout_takes_the_math_path():
    q = torch.randn(1, 2, 8, 16, device="tpu")
    out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert out.shape == q.shape


def test_cross_entropy_is_one_fused_op():
    logits, target = torch.randn(6, 10, requires_grad=True), torch.tensor([0, 3, -100, 9, 2, 2])
    op = str(torch.ops.tpu_kernels.cross_entropy.default)
    before = dispatch.op_counts().get((op, "xla"), 0)
    check(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), logits, target, grad=True)
    assert dispatch.op_counts().get((op, "xla"), 0) == before + 1


def test_sdpa_mask_that_requires_grad_gets_its_gradient():
    q, k, v = _sdpa_inputs(4)
    bias = torch.randn(1, 4, 33, 40, requires_grad=True)
    check(lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b), q, k, v, bias,
          grad=True, atol=2e-5, rtol=1e-4)  # same summation-order reason as above
