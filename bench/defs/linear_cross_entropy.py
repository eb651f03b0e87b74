"""Fused linear + cross entropy (forward) at LLM head sizes: hidden [tokens, h], weight [vocab, h]."""
from __future__ import annotations

import torch

from tpu_kernels.bench.spec import Case, KernelBench, case, nbytes

FLOPS_PER_LOGIT = 4     # online max, subtract, exp, add (as the cross-entropy bench)


def make_args(c: Case):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(c["n"], c["h"], generator=g).to(c.dtype)
    weight = (torch.randn(c["vocab"], c["h"], generator=g) * c["h"] ** -0.5).to(c.dtype)
    target = torch.randint(0, c["vocab"], (c["n"],), generator=g, dtype=torch.int64)
    return (hidden, weight, target), {"ignore_index": -100, "reduction": "mean",
                                      "label_smoothing": 0.0}


def flops(c: Case) -> float:
    n, h, v = c["n"], c["h"], c["vocab"]
    return 2 * n * h * v + FLOPS_PER_LOGIT * n * v


def bytes_moved(c: Case) -> float:
    # hidden and weight read once, int64 targets read, scalar loss written; no logits
    return nbytes(c.dtype, c["n"] * c["h"], c["vocab"] * c["h"], 1) + nbytes(torch.int64, c["n"])


BENCHMARKS = [KernelBench(
    name="linear_cross_entropy",
    op="tpu_kernels::linear_cross_entropy",
    make_args=make_args, flops=flops, bytes=bytes_moved,
    cases=(
        case(n=64, h=128, vocab=1000, quick=True),
        case(n=128, h=256, vocab=4096, dtype=torch.bfloat16, quick=True),
        case(n=4096, h=4096, vocab=32000, dtype=torch.bfloat16),
        case(n=8192, h=4096, vocab=128256, dtype=torch.bfloat16),
        case(n=16384, h=2048, vocab=128256, dtype=torch.bfloat16),
        case(n=1024, h=8192, vocab=256000, dtype=torch.bfloat16),
        case(n=2048, h=1024, vocab=32000),
    ),
)]
