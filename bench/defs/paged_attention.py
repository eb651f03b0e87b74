"""Ragged paged attention (``tpu_kernels::ragged_paged_attention``): one serving step's new
tokens attending to their contexts in a paged KV cache. Decode steps (one new token per
sequence) and mixed prefill+decode steps; the full serving-size sweep and the TPU compile
figures are ``python -m tpu_kernels.bench.paged_attention``."""
from __future__ import annotations

import torch

from tpu_kernels.bench.spec import Case, KernelBench, case, nbytes


def _lens(c: Case) -> tuple[list[int], list[int]]:
    """New tokens and context lengths per sequence: ``prefill`` sequences take ``q`` new
    tokens, the rest decode one; contexts are ``ctx`` tokens."""
    s, pre = c["seqs"], c["prefill"]
    return [c["q"]] * pre + [1] * (s - pre), [c["ctx"]] * s


def make_args(c: Case):
    g = torch.Generator().manual_seed(0)
    q_lens, kv_lens = _lens(c)
    s, ps, hkv, d = c["seqs"], c["page"], c["hkv"], c["d"]
    per_seq = -(-c["ctx"] // ps)
    pages = torch.randperm(s * per_seq, generator=g).to(torch.int32).reshape(s, per_seq)
    kv = (s * per_seq, hkv, ps, d)
    cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return (torch.randn(sum(q_lens), c["hq"], d, generator=g).to(c.dtype),
            torch.randn(*kv, generator=g).to(c.dtype), torch.randn(*kv, generator=g).to(c.dtype),
            torch.tensor(kv_lens, dtype=torch.int32), pages, cu,
            torch.tensor([s], dtype=torch.int32)), {}


def flops(c: Case) -> float:
    q_lens, kv_lens = _lens(c)
    return sum(4.0 * q * k * c["hq"] * c["d"] for q, k in zip(q_lens, kv_lens))


def bytes_(c: Case) -> float:
    q_lens, kv_lens = _lens(c)
    t = sum(q_lens)
    # q read and out written; each sequence's context K and V read once
    return nbytes(c.dtype, 2 * t * c["hq"] * c["d"], 2 * sum(kv_lens) * c["hkv"] * c["d"])


CASES = (
    case(seqs=4, prefill=0, q=1, ctx=40, page=16, hq=4, hkv=2, d=128, quick=True),
    case(seqs=4, prefill=1, q=24, ctx=40, page=16, hq=4, hkv=2, d=128, dtype=torch.bfloat16, quick=True),
    case(seqs=64, prefill=0, q=1, ctx=2048, page=16, hq=32, hkv=8, d=128, dtype=torch.bfloat16),
    case(seqs=16, prefill=4, q=512, ctx=4096, page=32, hq=32, hkv=8, d=128, dtype=torch.bfloat16),
)

BENCHMARKS = [
    KernelBench(name="ragged_paged_attention", op="tpu_kernels::ragged_paged_attention",
                make_args=make_args, flops=flops, bytes=bytes_, cases=CASES),
]
