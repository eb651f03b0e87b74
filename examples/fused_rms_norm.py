"""Pattern 2: a new fused op with autograd, callable from PyTorch and torch.compile.

Run: python examples/fused_rms_norm.py
"""
import jax
import jax.numpy as jnp
import torch

import tpu_kernels  # noqa: F401
from tpu_kernels import tpu_kernel
from tpu_kernels.testing import check_parity


def reference(x, w, eps=1e-6):
    """Plain torch: the CPU implementation and the parity reference."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rms_norm_backward(grad, x, w, eps=1e-6):
    """Hand-written backward in JAX: returns one gradient per tensor argument."""
    xf = x.astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps)
    xhat = xf * rstd
    gw = grad * w
    dx = rstd * (gw - xhat * jnp.mean(gw * xhat, -1, keepdims=True))
    dw = jnp.sum((grad * xhat).reshape(-1, x.shape[-1]), 0)
    return dx.astype(x.dtype), dw.astype(w.dtype)


@tpu_kernel("mylib::fused_rms_norm", reference=reference, backward=rms_norm_backward)
def fused_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps) * w).astype(x.dtype)


if __name__ == "__main__":
    x = torch.randn(4, 64, device="tpu", requires_grad=True)
    w = torch.ones(64, device="tpu", requires_grad=True)
    y = torch.ops.mylib.fused_rms_norm(x, w, 1e-6)     # or fused_rms_norm(x, w)
    y.sum().backward()
    print("y", tuple(y.shape), y.device, "| dx", tuple(x.grad.shape), "| dw", tuple(w.grad.shape))
    print("on CPU through the reference:", fused_rms_norm(torch.ones(2, 4), torch.ones(4)).tolist()[0])
    print("impls checked against the reference:", check_parity(fused_rms_norm, (torch.randn(8, 64), torch.randn(64), 1e-6)))
