"""``tpu_kernels::ragged_paged_attention``: attention of a batch of sequences' new tokens
to their contexts in a paged KV cache (what a serving engine's step runs per layer).

Defined here with its XLA impl (gather the pages, masked attention: the reference every
kernel falls back to); the Pallas kernel binds to it in ``registry/kernels``. The CPU
reference is plain torch, so the op also runs (and is parity-checked) on CPU tensors.
"""
from __future__ import annotations

import math

import torch

from tpu_kernels.pallas.reference import ragged_paged_attention as rpa_ref
from tpu_kernels.registry.decorator import tpu_kernel


def _cpu_reference(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, scale=None):
    """Per sequence: its pages as one context, causal attention of its new tokens."""
    out = torch.zeros_like(q)
    _, hkv, ps, d = k_pages.shape
    rep = q.shape[1] // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    for s in range(min(int(num_seqs.reshape(-1)[0]), kv_lens.shape[0])):
        q0, q1, n = int(cu_q_lens[s]), int(cu_q_lens[s + 1]), int(kv_lens[s])
        if q1 <= q0:
            continue
        pages = page_table[s, :-(-n // ps)].long()
        k, v = (x[pages].transpose(0, 1).reshape(hkv, -1, d)[:, :n].repeat_interleave(rep, 0)
                .float() for x in (k_pages, v_pages))
        qs = q[q0:q1].transpose(0, 1).float()                       # [Hq, q_len, D]
        pos = torch.arange(n - (q1 - q0), n)[:, None]
        mask = torch.arange(n)[None, :] <= pos
        o = torch.nn.functional.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale)
        out[q0:q1] = o.transpose(0, 1).to(q.dtype)
    return out


@tpu_kernel("tpu_kernels::ragged_paged_attention", kind="xla", reference=_cpu_reference)
def ragged_paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                           kv_lens: torch.Tensor, page_table: torch.Tensor,
                           cu_q_lens: torch.Tensor, num_seqs: torch.Tensor,
                           scale: float | None = None) -> torch.Tensor:
    """Causal attention of each sequence's new tokens ``q [T, Hq, D]`` (sequence s owns
    rows ``cu_q_lens[s]:cu_q_lens[s+1]``) to its ``kv_lens[s]`` context tokens (new ones
    included), kept in pages of ``k_pages, v_pages [N, Hkv, page_size, D]`` listed by
    ``page_table [S, P]``; the first ``num_seqs [1]`` sequences are live, other rows give 0."""
    return rpa_ref.ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens,
                                          num_seqs, scale=scale)
