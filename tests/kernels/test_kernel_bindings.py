"""Every kernel bound in registry/bindings runs through the tpu device and matches CPU, on
the examples its manifest entry gives (registry/manifest.py).

``check_parity`` forces each impl of the op in turn (Pallas/Helion in interpret mode)
against CPU torch (ATen ops) or the op's reference (this library's custom ops).
"""
from __future__ import annotations

import pytest
import torch

from tpu_kernels import registry
from tpu_kernels.registry.manifest import KERNELS
from tpu_kernels.testing import check_parity, tol

EXAMPLES = [pytest.param(k, op, id=f"{k.name}:{op}") for k in KERNELS for op in k.examples]


@pytest.mark.parametrize("kernel,op", EXAMPLES)
def test_binding_matches_reference(kernel, op):
    kinds = {i.kind for i in registry.impls(op)}
    assert kernel.kind in kinds, f"{op} has no {kernel.kind} kernel bound"
    n = check_parity(op, kernel.examples[op](), **tol(torch.float32, kernel=True))
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
    torch.testing.assert_close(at.grad.cpu(), a.grad, **tol(torch.float32, kernel=True))
    torch.testing.assert_close(bt.grad.cpu(), b.grad, **tol(torch.float32, kernel=True))
