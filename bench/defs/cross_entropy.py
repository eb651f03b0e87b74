"""Cross entropy over logits [tokens, vocab] (forward), the custom op binding the Pallas kernel."""
from __future__ import annotations

import torch

from tpu_kernels.bench.spec import Case, KernelBench, case, nbytes

# Per logit: running max, subtract, exp, add to the running sum (target pick is a select).
FLOPS_PER_LOGIT = 4


def make_args(c: Case):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(c["n"], c["vocab"], generator=g, dtype=torch.float32).to(c.dtype)
    target = torch.randint(0, c["vocab"], (c["n"],), generator=g, dtype=torch.int64)
    return (logits, target), {"ignore_index": -100, "reduction": "mean", "label_smoothing": 0.0}


def flops(c: Case) -> float:
    return FLOPS_PER_LOGIT * c["n"] * c["vocab"]


def bytes_moved(c: Case) -> float:
    # logits read once, int64 targets read, one scalar loss written
    return nbytes(c.dtype, c["n"] * c["vocab"], 1) + nbytes(torch.int64, c["n"])


BENCHMARKS = [KernelBench(
    name="cross_entropy",
    op="tpu_kernels::cross_entropy",
    make_args=make_args, flops=flops, bytes=bytes_moved,
    cases=(
        case(n=64, vocab=1000, quick=True),
        case(n=128, vocab=4096, dtype=torch.bfloat16, quick=True),
        case(n=4096, vocab=32000, dtype=torch.bfloat16),
        case(n=4096, vocab=32000),
        case(n=8192, vocab=128256, dtype=torch.bfloat16),
        case(n=2048, vocab=256000, dtype=torch.bfloat16),
    ),
)]
