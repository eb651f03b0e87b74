"""New ops from @tpu_kernel: eager on tpu and CPU, autograd, and torch.compile tracing."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch

from tpu_kernels import tpu_kernel
from tpu_kernels.testing import check_parity


def _ref(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@tpu_kernel("testlib::rms", reference=_ref, backward="vjp")
def rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w


@tpu_kernel("testlib::pair", reference=lambda a, xs: (a + xs[0], a * xs[1]))
def pair(a: torch.Tensor, xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return a + xs[0], a * xs[1]


def test_schema_inferred_from_hints():
    args = torch.ops.testlib.rms.default._schema.arguments
    assert [(a.name, str(a.type)) for a in args] == [("x", "Tensor"), ("w", "Tensor"), ("eps", "float")]
    assert args[2].default_value == pytest.approx(1e-6)
    assert "Tensor[] xs" in str(torch.ops.testlib.pair.default._schema)


def test_eager_tpu_cpu_and_gradients():
    assert check_parity(rms, (torch.randn(4, 8), torch.randn(8), 1e-6)) == 1
    assert check_parity(pair, (torch.randn(3), [torch.randn(3), torch.randn(3)])) == 1
    x = torch.randn(4, 8, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    _ref(x, torch.ones(8)).sum().backward()
    rms(xt, torch.ones(8, device="tpu")).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad)


def test_torch_compile_traces_the_op():
    f = torch.compile(lambda x, w: torch.ops.testlib.rms(x, w, 1e-6) * 2, fullgraph=True)
    x, w = torch.randn(4, 8), torch.randn(8)
    torch.testing.assert_close(f(x, w), _ref(x, w) * 2)


def test_no_backward_names_the_op():
    @tpu_kernel("testlib::nobwd")
    def nobwd(x: torch.Tensor) -> torch.Tensor:
        return x * 2
    x = torch.randn(3, device="tpu", requires_grad=True)
    with pytest.raises(RuntimeError, match="testlib::nobwd has no backward"):
        nobwd(x).sum().backward()
