"""A paged KV cache: fixed-size pages handed out to sequences from a free list.

Each layer keeps K and V as ``[num_pages, kv_heads, page_size, head_dim]`` tensors (the
layout ``tpu_kernels::ragged_paged_attention`` reads: one page holds every kv head). Page 0 is never handed out: the
padding rows of a step write their K/V there, so writes need no masking.
"""
from __future__ import annotations

import torch

PAD_PAGE = 0


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


class PageAllocator:
    """Which pages each sequence holds and how many tokens it has stored in them."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 2:
            raise ValueError(f"PageAllocator: num_pages={num_pages}, needs at least 2 "
                             f"(page {PAD_PAGE} is kept for padding rows)")
        self.num_pages, self.page_size = num_pages, page_size
        self._free = list(range(num_pages - 1, PAD_PAGE, -1))   # pop() hands out low ids first
        self.pages: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, seq: int, num_tokens: int = 0) -> list[int]:
        """Start sequence ``seq`` with room for ``num_tokens``; returns its pages."""
        if seq in self.pages:
            raise ValueError(f"PageAllocator.allocate: sequence {seq} already holds pages")
        self.pages[seq], self.lengths[seq] = [], 0
        self._reserve(seq, num_tokens)
        return self.pages[seq]

    def append(self, seq: int, num_tokens: int) -> list[tuple[int, int]]:
        """Store ``num_tokens`` more tokens of ``seq``: (page, offset) of each, pages
        allocated as needed."""
        start = self.lengths[seq]
        self._reserve(seq, start + num_tokens)
        self.lengths[seq] = start + num_tokens
        pages, ps = self.pages[seq], self.page_size
        return [(pages[p // ps], p % ps) for p in range(start, start + num_tokens)]

    def free(self, seq: int) -> None:
        """Return the pages of ``seq`` to the free list."""
        self._free.extend(reversed(self.pages.pop(seq)))
        del self.lengths[seq]

    def _reserve(self, seq: int, num_tokens: int) -> None:
        pages = self.pages[seq]
        need = pages_for(num_tokens, self.page_size) - len(pages)
        if need > len(self._free):
            raise MemoryError(f"PageAllocator: sequence {seq} needs {need} more pages, "
                              f"{len(self._free)} of {self.num_pages} are free")
        pages.extend(self._free.pop() for _ in range(max(need, 0)))


class PagedKVCache:
    """K and V pages of every layer, on ``device``, with their allocator."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_pages: int,
                 page_size: int, dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (num_pages, num_kv_heads, page_size, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.allocator = PageAllocator(num_pages, page_size)

    @property
    def page_size(self) -> int:
        return self.allocator.page_size
