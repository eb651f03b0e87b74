"""Dense matmuls (aten.mm / aten.bmm / aten.addmm) at LLM projection and attention sizes."""
from __future__ import annotations

import torch

from tpu_kernels.bench.spec import Case, KernelBench, case, nbytes


def _randn(g: torch.Generator, c: Case, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(c.dtype)


def _mm_args(c: Case):
    g = torch.Generator().manual_seed(0)
    return (_randn(g, c, c["m"], c["k"]), _randn(g, c, c["k"], c["n"])), {}


def _bmm_args(c: Case):
    g = torch.Generator().manual_seed(0)
    return (_randn(g, c, c["b"], c["m"], c["k"]), _randn(g, c, c["b"], c["k"], c["n"])), {}


def _addmm_args(c: Case):
    g = torch.Generator().manual_seed(0)
    bias = _randn(g, c, c["n"])                       # nn.Linear bias, broadcast over rows
    return (bias, _randn(g, c, c["m"], c["k"]), _randn(g, c, c["k"], c["n"])), {}


def mm_flops(c: Case) -> float:
    return 2 * c["m"] * c["n"] * c["k"]


def mm_bytes(c: Case) -> float:
    return nbytes(c.dtype, c["m"] * c["k"], c["k"] * c["n"], c["m"] * c["n"])


def bmm_flops(c: Case) -> float:
    return c["b"] * mm_flops(c)


def bmm_bytes(c: Case) -> float:
    return c["b"] * mm_bytes(c)


def addmm_flops(c: Case) -> float:
    return mm_flops(c) + c["m"] * c["n"]               # + one bias add per output


def addmm_bytes(c: Case) -> float:
    return mm_bytes(c) + nbytes(c.dtype, c["n"])        # + the bias vector


BF16 = torch.bfloat16
BENCHMARKS = [
    KernelBench(
        name="mm", op="aten::mm", make_args=_mm_args, flops=mm_flops, bytes=mm_bytes,
        cases=(
            case(m=128, k=256, n=128, quick=True),
            case(m=33, k=70, n=129, quick=True),                 # odd: padded on every axis
            case(m=8, k=4096, n=4096, dtype=BF16),               # decode-like skinny m
            case(m=2048, k=4096, n=4096, dtype=BF16),
            case(m=4096, k=4096, n=14336, dtype=BF16),           # MLP up-projection
            case(m=4096, k=14336, n=4096, dtype=BF16),           # MLP down-projection
            case(m=8192, k=8192, n=8192, dtype=BF16),
            case(m=2048, k=2048, n=2048),                        # f32, precision HIGHEST
        )),
    KernelBench(
        name="bmm", op="aten::bmm", make_args=_bmm_args, flops=bmm_flops,
        bytes=bmm_bytes,
        cases=(
            case(b=4, m=64, k=64, n=128, quick=True),
            case(b=32, m=2048, k=128, n=2048, dtype=BF16),       # q k^T per head
            case(b=32, m=2048, k=2048, n=128, dtype=BF16),       # p v per head
            case(b=8, m=1024, k=1024, n=1024),
        )),
    KernelBench(
        name="addmm", op="aten::addmm", make_args=_addmm_args, flops=addmm_flops,
        bytes=addmm_bytes,
        cases=(
            case(m=64, k=128, n=256, quick=True),
            case(m=1, k=8192, n=8192, dtype=BF16),               # decode linear
            case(m=4096, k=4096, n=4096, dtype=BF16),            # nn.Linear with bias
            case(m=4096, k=1024, n=4096),
        )),
]
