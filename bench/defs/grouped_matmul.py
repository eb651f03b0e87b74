"""Grouped (ragged) matmul for mixture-of-experts layers: tpu_kernels.ragged_dot."""
from __future__ import annotations

import torch

from tpu_kernels.bench.spec import Case, KernelBench, case, nbytes


def group_sizes(c: Case) -> torch.Tensor:
    """Uneven but deterministic expert loads summing to m (router-like imbalance)."""
    g = torch.Generator().manual_seed(1)
    weights = torch.rand(c["g"], generator=g) + 0.25
    sizes = torch.floor(weights / weights.sum() * c["m"]).to(torch.int32)
    sizes[0] += c["m"] - int(sizes.sum())
    return sizes


def make_args(c: Case):
    g = torch.Generator().manual_seed(0)
    lhs = torch.randn(c["m"], c["k"], generator=g).to(c.dtype)
    rhs = (torch.randn(c["g"], c["k"], c["n"], generator=g) / c["k"] ** 0.5).to(c.dtype)
    return (lhs, rhs, group_sizes(c)), {}


def flops(c: Case) -> float:
    return 2 * c["m"] * c["k"] * c["n"]          # every row meets one expert's [k, n]


def bytes_moved(c: Case) -> float:
    # lhs and every expert's weights read, output written, int32 group sizes read
    return (nbytes(c.dtype, c["m"] * c["k"], c["g"] * c["k"] * c["n"], c["m"] * c["n"])
            + nbytes(torch.int32, c["g"]))


BF16 = torch.bfloat16
BENCHMARKS = [KernelBench(
    name="ragged_dot",
    op="tpu_kernels::ragged_dot",
    make_args=make_args, flops=flops, bytes=bytes_moved,
    cases=(
        case(m=64, k=128, n=128, g=4, quick=True),
        case(m=33, k=70, n=129, g=3),                              # odd sizes
        case(m=8192, k=4096, n=14336, g=8, dtype=BF16),            # Mixtral-like w1 (top-2)
        case(m=8192, k=14336, n=4096, g=8, dtype=BF16),            # Mixtral-like w2
        case(m=16384, k=2048, n=1408, g=64, dtype=BF16),           # many small experts
        case(m=2048, k=1024, n=2048, g=16),
    ),
)]
