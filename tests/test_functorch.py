"""torch.func and forward-mode AD on tpu tensors match CPU: jacfwd / jacrev / hessian
(forward mode asks the device for zero tangents, ``aten._efficientzerotensor``), dual
numbers, vmap with in/out dims and chunks, grad_and_value over functional_call."""
from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import functional_call, grad_and_value, hessian, jacfwd, jacrev, vmap

import tpu_kernels  # noqa: F401


def _f(x):
    return (x.sin() * x.exp()).sum()


TRANSFORMS = {
    "jacfwd of jacrev": lambda x: jacfwd(jacrev(_f))(x),
    "hessian": lambda x: hessian(_f)(x),
    "jacfwd elementwise": lambda x: jacfwd(torch.sin)(x),
    "jacfwd of a matmul": lambda x: jacfwd(lambda v: v @ torch.ones(4, 3, device=v.device))(x),
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_jacobians_match_cpu(name):
    x = torch.randn(4, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(TRANSFORMS[name](x.to("tpu")).cpu(), TRANSFORMS[name](x), atol=1e-5, rtol=1e-5)


def test_dual_numbers_and_zero_tangents():
    x = torch.randn(4, generator=torch.Generator().manual_seed(0))
    tangents = {}
    with fwAD.dual_level():
        for d in ("cpu", "tpu"):
            y = torch.nn.functional.gelu(fwAD.make_dual(x.to(d), torch.ones(4, device=d))).exp()
            tangents[d] = fwAD.unpack_dual(y).tangent.cpu()
    torch.testing.assert_close(tangents["tpu"], tangents["cpu"], atol=1e-5, rtol=1e-5)
    zero = torch._efficientzerotensor((2, 3), device="tpu")
    assert zero.device.type == "tpu" and not zero.cpu().any()


def test_vmap_and_grad_over_functional_call():
    def run(d):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).to(d)
        x, y = torch.randn(6, 3).to(d), torch.randn(4, 3).to(d)
        grads, value = grad_and_value(lambda p: functional_call(m, p, (x,)).pow(2).mean())(dict(m.named_parameters()))
        return [value, *grads.values(), vmap(torch.dot, in_dims=(0, 1))(y, y.T), vmap(lambda a: a * 2, out_dims=1)(y),
                vmap(torch.outer, chunk_size=2)(y, y)]
    for got, want in zip(run("tpu"), run("cpu")):
        torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
