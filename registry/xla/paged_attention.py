"""XLA impl of ``tpu_kernels::ragged_paged_attention`` (declared with its CPU reference in
``registry/custom_ops/library.py``): gather the pages, masked attention; the lowering the
Pallas kernel (``registry/bindings/ragged_paged_attention.py``) falls back to.
"""
from __future__ import annotations

import torch

from tpu_kernels.pallas.reference import ragged_paged_attention as rpa_ref
from tpu_kernels.registry.custom_ops import library  # noqa: F401  (declares the op first)
from tpu_kernels.registry.decorator import tpu_kernel


@tpu_kernel("tpu_kernels::ragged_paged_attention", kind="xla")
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
