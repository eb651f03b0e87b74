"""Pattern 3: a Helion kernel (compiled by Helion's Pallas backend) as a new op.

Off TPU the kernel runs in Pallas interpret mode. Run: python examples/helion_softmax.py
"""
import helion
import helion.language as hl
import torch

import tpu_kernels  # noqa: F401
from tpu_kernels import tpu_kernel


def reference(x):
    return torch.softmax(x, dim=-1)


@tpu_kernel("mylib::softmax_helion", reference=reference)
@helion.kernel(backend="pallas", static_shapes=True, config=helion.Config(block_sizes=[8]))
def softmax_helion(x: torch.Tensor) -> torch.Tensor:
    n, _ = x.size()
    out = torch.empty_like(x)
    for tile_n in hl.tile(n):
        row = x[tile_n, :].to(torch.float32)
        e = torch.exp(row - torch.amax(row, dim=-1, keepdim=True))
        out[tile_n, :] = (e / torch.sum(e, dim=-1, keepdim=True)).to(out.dtype)
    return out


if __name__ == "__main__":
    x = torch.randn(16, 128)
    y = softmax_helion(x.to("tpu"))
    print("max |tpu - cpu|:", (y.cpu() - reference(x)).abs().max().item())
