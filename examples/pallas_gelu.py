"""Pattern 1: a custom Pallas kernel overrides an ATen op where a predicate holds.

Run: python examples/pallas_gelu.py
"""
import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

import tpu_kernels  # noqa: F401  (registers the tpu device)
from tpu_kernels import registry, tpu_kernel
from tpu_kernels.pallas.tpu_info import on_tpu

LANES, ROWS = 128, 16   # a (16, 128) block is legal for bf16 on TPU


def _gelu_kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)          # compute in f32, store in bf16
    o_ref[...] = (0.5 * x * (1 + jax.lax.erf(x * 0.7071067811865476))).astype(o_ref.dtype)


def pallas_gelu(x: jax.Array) -> jax.Array:
    n = x.size
    rows = -(-n // LANES)
    rows = -(-rows // ROWS) * ROWS
    flat = jnp.pad(x.reshape(-1), (0, rows * LANES - n)).reshape(rows, LANES)
    out = pl.pallas_call(
        _gelu_kernel, grid=(rows // ROWS,),
        in_specs=[pl.BlockSpec((ROWS, LANES), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((ROWS, LANES), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(flat.shape, flat.dtype),
        interpret=not on_tpu(),
    )(flat)
    return out.reshape(-1)[:n].reshape(x.shape)


@tpu_kernel("aten::gelu", supports=lambda x, approximate="none":
            x.dtype == torch.bfloat16 and approximate == "none")
def my_gelu(x, approximate="none"):
    return pallas_gelu(x)


if __name__ == "__main__":
    x = torch.randn(3, 300, dtype=torch.bfloat16)
    y = torch.nn.functional.gelu(x.to("tpu"))
    impl, _ = registry.which("aten::gelu", x)
    print("ran:", impl.kind, impl.name)
    print("max |tpu - cpu|:", (y.cpu().float() - torch.nn.functional.gelu(x).float()).abs().max().item())
    # float32 is refused by the predicate, so the built-in lowering runs
    print("float32 runs:", registry.which("aten::gelu", x.float())[0].kind)
