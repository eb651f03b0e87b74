"""Every kernel binding in registry/kernels runs through the tpu device and matches CPU.

``check_parity`` forces each impl of the op in turn (Pallas/Helion in interpret mode)
against CPU torch (ATen ops) or the op's reference (this library's custom ops).
"""
from __future__ import annotations

import pytest
import torch

from tpu_kernels import registry
from tpu_kernels.testing import check_parity

torch.manual_seed(0)
X = torch.randn(7, 129)
Q, K = torch.randn(1, 2, 7, 64), torch.randn(1, 2, 7, 64)
COS, SIN = torch.randn(7, 64), torch.randn(7, 64)

CASES = {
    "aten::_fused_rms_norm": (X, [129], torch.randn(129), 1e-6),
    "aten::native_layer_norm": (X, [129], torch.randn(129), torch.randn(129), 1e-5),
    "aten::_softmax": (X, -1, False),
    "aten::_log_softmax": (X, -1, False),
    "aten::glu": (torch.randn(7, 258), -1),
    "tpu_kernels::swiglu": (X, torch.randn(7, 129)),
    "tpu_kernels::geglu": (X, torch.randn(7, 129)),
    "tpu_kernels::rope": (Q, K, COS, SIN),
    "aten::var_mean.correction": (X, [-1]),
    "aten::cumsum": (X, -1),
    "aten::topk": (torch.randperm(7 * 129).float().reshape(7, 129), 5),
    "aten::mm": (torch.randn(33, 70), torch.randn(70, 129)),
    "aten::embedding": (torch.randn(50, 128), torch.randint(0, 50, (9,))),
    "tpu_kernels::cross_entropy": (torch.randn(6, 300), torch.tensor([0, 3, -100, 299, 2, 2])),
    "tpu_kernels::ragged_dot": (torch.randn(7, 8), torch.randn(3, 8, 5), torch.tensor([2, 0, 5])),
    "aten::_grouped_mm": (torch.randn(7, 8), torch.randn(3, 8, 8), torch.tensor([2, 2, 7], dtype=torch.int32)),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_binding_matches_reference(op):
    kinds = {i.kind for i in registry.impls(op)}
    assert kinds & {"pallas", "helion"}, f"{op} has no kernel bound"
    n = check_parity(op, CASES[op], atol=2e-5, rtol=2e-5)  # f32 kernels: blocked sums
    assert n >= 2, f"{op}: only {n} impls accepted the example"


@pytest.mark.parametrize("op", ["tpu_kernels::swiglu", "tpu_kernels::geglu"])
def test_gated_backward_runs_the_helion_kernel(op):
    a, b = torch.randn(7, 129, requires_grad=True), torch.randn(7, 129, requires_grad=True)
    fn = getattr(torch.ops.tpu_kernels, op.split("::")[1])
    fn(a, b).sum().backward()
    at, bt = (t.detach().to("tpu").requires_grad_() for t in (a, b))
    bwd = registry.impls(op + "_backward")
    assert any(i.kind == "helion" for i in bwd)
    with registry.interpret():
        fn(at, bt).sum().backward()
    torch.testing.assert_close(at.grad.cpu(), a.grad, atol=2e-5, rtol=2e-5)  # f32 kernel
    torch.testing.assert_close(bt.grad.cpu(), b.grad, atol=2e-5, rtol=2e-5)
