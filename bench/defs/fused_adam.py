"""Fused AdamW step over a list of parameter tensors (torch's ``_fused_adamw_``)."""
from __future__ import annotations

import torch

from tpu_kernels.bench.spec import Case, KernelBench, case, nbytes

# Per element: decay (2), exp_avg lerp (3), exp_avg_sq (4), denom sqrt/div/add (3),
# update mul/div/sub (3); amsgrad adds a max.
FLOPS_PER_ELEMENT = 15
HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False,
             maximize=False)


def make_args(c: Case):
    g = torch.Generator().manual_seed(0)
    k, numel = c["tensors"], c["numel"]

    def tensors(fn):
        return [fn(numel).to(c.dtype) for _ in range(k)]

    params = tensors(lambda n: torch.randn(n, generator=g))
    grads = tensors(lambda n: torch.randn(n, generator=g))
    exp_avgs = tensors(lambda n: torch.randn(n, generator=g) * 0.1)
    exp_avg_sqs = tensors(lambda n: torch.rand(n, generator=g) * 0.01)
    steps = [torch.tensor(10.0) for _ in range(k)]
    return (params, grads, exp_avgs, exp_avg_sqs, [], steps), dict(HYPER)


def flops(c: Case) -> float:
    return FLOPS_PER_ELEMENT * c["tensors"] * c["numel"]


def bytes_moved(c: Case) -> float:
    # read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq; read steps
    return nbytes(c.dtype, 7 * c["tensors"] * c["numel"]) + nbytes(torch.float32, c["tensors"])


BENCHMARKS = [KernelBench(
    name="fused_adamw",
    op="aten::_fused_adamw_",
    make_args=make_args, flops=flops, bytes=bytes_moved,
    cases=(
        case(tensors=4, numel=1000, quick=True),
        case(tensors=2, numel=65536, dtype=torch.bfloat16, quick=True),
        case(tensors=16, numel=1024 * 4096),                     # a stack of 1k x 4k weights
        case(tensors=4, numel=4096 * 11008),                     # Llama-7B MLP matrices
        case(tensors=8, numel=4096 * 4096, dtype=torch.bfloat16),
        case(tensors=64, numel=4096),                            # many small (norm) tensors
    ),
)]
