"""Attention forward at LLM sizes.

The op is ``aten._scaled_dot_product_flash_attention_for_cpu.default``: the overload
``F.scaled_dot_product_attention`` reaches for a device that takes the CPU path (it is in
aten_targets.tsv), with signature (q, k, v, dropout_p, is_causal, *, attn_mask, scale)
-> (out, logsumexp); it accepts grouped-query k/v and additive float masks.
"""
from __future__ import annotations

import torch

from tpu_kernels.bench.spec import Case, KernelBench, case, nbytes


def make_args(c: Case):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(c["b"], c["hq"], c["sq"], c["d"], generator=g).to(c.dtype)
    k = torch.randn(c["b"], c["hkv"], c["skv"], c["d"], generator=g).to(c.dtype)
    v = torch.randn(c["b"], c["hkv"], c["skv"], c["d"], generator=g).to(c.dtype)
    kwargs = {}
    if c["mask"]:               # additive padding-style mask, broadcast over heads
        keep = torch.rand(c["b"], 1, c["sq"], c["skv"], generator=g) < 0.9
        kwargs["attn_mask"] = torch.zeros(keep.shape).masked_fill(~keep, float("-inf")).to(c.dtype)
    return (q, k, v, 0.0, bool(c["causal"])), kwargs


def flops(c: Case) -> float:
    # q k^T and p v: 2 matmuls x 2 flops x b*hq*sq*skv*d; causal keeps about half.
    full = 4 * c["b"] * c["hq"] * c["sq"] * c["skv"] * c["d"]
    return full / 2 if c["causal"] else full


def bytes_moved(c: Case) -> float:
    b, hq, hkv, sq, skv, d = (c[x] for x in ("b", "hq", "hkv", "sq", "skv", "d"))
    total = nbytes(c.dtype, 2 * b * hq * sq * d, 2 * b * hkv * skv * d)   # q, out; k, v
    total += nbytes(torch.float32, b * hq * sq)                          # logsumexp out
    if c["mask"]:
        total += nbytes(c.dtype, b * sq * skv)
    return total


def _c(b, hq, hkv, s, d, causal=1, mask=0, skv=None, dtype=torch.bfloat16, quick=False):
    return case(b=b, hq=hq, hkv=hkv, sq=s, skv=skv or s, d=d, causal=causal, mask=mask,
                dtype=dtype, quick=quick)


BENCHMARKS = [KernelBench(
    name="flash_attention",
    op="aten::_scaled_dot_product_flash_attention_for_cpu",
    make_args=make_args, flops=flops, bytes=bytes_moved,
    cases=(
        _c(1, 2, 2, 128, 64, dtype=torch.float32, quick=True),
        _c(1, 2, 1, 77, 96, causal=0, skv=33, dtype=torch.float32, quick=True),  # odd, GQA
        _c(1, 32, 8, 2048, 128),                   # Llama-3-8B-like GQA, causal
        _c(1, 32, 8, 8192, 128),
        _c(4, 16, 16, 1024, 64, causal=0),         # encoder-style, no causal
        _c(2, 16, 16, 1024, 128, causal=0, mask=1),   # additive padding mask
        _c(1, 8, 4, 4096, 256),                    # large head dim (Gemma-like)
        _c(1, 32, 32, 128, 128),                   # short prompt
    ),
)]
