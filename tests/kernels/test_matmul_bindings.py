"""The Pallas matmul and grouped-matmul bindings against CPU torch, forward and backward:
ragged shapes (edge blocks, a ragged k masked in the kernel), operands handed over as
transposed views (F.linear's ``w.t()``), and _grouped_mm with uneven and empty groups."""
from __future__ import annotations

import pytest
import torch

from tpu_kernels import registry
from tpu_kernels.testing import tol


def _pallas(op: str):
    return next(i for i in registry.impls(op) if i.kind == "pallas")


def _run(op: str, fn, *cpu_args):
    """fn on CPU and on tpu with ``op``'s Pallas impl forced; outputs and grads."""
    leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in cpu_args]
    tpu = [a.detach().to("tpu").requires_grad_(a.is_floating_point()) for a in cpu_args]
    want = fn(*leaves)
    gout = torch.randn(want.shape, generator=torch.Generator().manual_seed(9)).to(want.dtype)
    want.backward(gout)
    with registry.force(_pallas(op)):
        got = fn(*tpu)
        got.backward(gout.to("tpu"))
    tols = tol(cpu_args[0].dtype, kernel=True)
    torch.testing.assert_close(got.cpu(), want, **tols)
    for x, y in zip(tpu, leaves):
        if y.grad is not None:
            torch.testing.assert_close(x.grad.cpu(), y.grad, **tols)


def _r(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("m,k,n", [(33, 70, 129), (200, 150, 136)])
def test_mm_ragged_forward_backward(m, k, n):
    _run("aten::mm", torch.mm, _r(m, k), _r(k, n, seed=1))


def test_mm_transposed_views():
    """x @ w.t() (F.linear without bias) and x.t() @ y: views, not copies, on the CPU side."""
    _run("aten::mm", lambda x, w: x @ w.t(), _r(40, 300), _r(136, 300, seed=1))
    _run("aten::mm", lambda x, y: x.t() @ y, _r(300, 40), _r(300, 136, seed=1))


def test_addmm_forward_backward():
    _run("aten::addmm", lambda b, x, w: torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0),
         _r(129, seed=2), _r(33, 70), _r(129, 70, seed=1))


def test_bmm_forward_backward():
    _run("aten::bmm", torch.bmm, _r(3, 20, 70), _r(3, 70, 130, seed=1))


@pytest.mark.parametrize("ends", [[10, 10, 37, 64], [0, 64, 64]])   # uneven; empty groups
def test_grouped_mm_forward_backward(ends):
    offs = torch.tensor(ends, dtype=torch.int32)
    a, b = _r(64, 128, dtype=torch.bfloat16), _r(len(ends), 128, 136, seed=1, dtype=torch.bfloat16)
    _run("aten::_grouped_mm", lambda a, b, o: torch._grouped_mm(a, b, o), a, b, offs)
