"""Embedding lookup (row gather) and its dense backward (scatter-add) at LLM vocab/hidden sizes."""
from __future__ import annotations

import torch

from tpu_kernels.bench.spec import Case, KernelBench, case, nbytes


def _indices(c: Case, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, c["vocab"], (c["n"],), generator=g, dtype=torch.int64)


def make_fwd_args(c: Case):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(c["vocab"], c["dim"], generator=g).to(c.dtype)
    return (weight, _indices(c, g)), {}


def make_bwd_args(c: Case):
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(c["n"], c["dim"], generator=g).to(c.dtype)
    return (grad, _indices(c, g), c["vocab"], -1, False), {}


def fwd_bytes(c: Case) -> float:
    # gathered rows read + output written, int64 indices read
    return nbytes(c.dtype, 2 * c["n"] * c["dim"]) + nbytes(torch.int64, c["n"])


def bwd_flops(c: Case) -> float:
    return c["n"] * c["dim"]          # one add per grad element


def bwd_bytes(c: Case) -> float:
    # grad rows read, indices read, the whole [vocab, dim] grad written (zeros included)
    return nbytes(c.dtype, c["n"] * c["dim"], c["vocab"] * c["dim"]) + nbytes(torch.int64, c["n"])


CASES = (
    case(n=64, vocab=1000, dim=128, quick=True),
    case(n=128, vocab=4096, dim=256, dtype=torch.bfloat16, quick=True),
    case(n=4096, vocab=32000, dim=4096, dtype=torch.bfloat16),
    case(n=8192, vocab=128256, dim=4096, dtype=torch.bfloat16),
    case(n=16384, vocab=32000, dim=1024),
    case(n=2048, vocab=256000, dim=8192, dtype=torch.bfloat16),
)

BENCHMARKS = [
    KernelBench(name="embedding", op="aten::embedding", make_args=make_fwd_args,
                flops=lambda c: 0.0, bytes=fwd_bytes, cases=CASES),
    KernelBench(name="embedding_dense_backward", op="aten::embedding_dense_backward",
                make_args=make_bwd_args, flops=bwd_flops, bytes=bwd_bytes, cases=CASES),
]
