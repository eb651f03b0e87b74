"""Pallas ragged paged attention bound to ``tpu_kernels::ragged_paged_attention``."""
from __future__ import annotations

from tpu_kernels.registry.kernel_modules import kernel_module
from tpu_kernels.registry.decorator import tpu_kernel
from tpu_kernels.registry.dtypes import to_jax_dtype

rpa = kernel_module("tpu_kernels.pallas.ragged_paged_attention")


def _supports(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, scale=None):
    return rpa.supports(q.shape, to_jax_dtype(q.dtype), k_pages.shape, to_jax_dtype(k_pages.dtype),
                        v_pages.shape, to_jax_dtype(v_pages.dtype), kv_lens.shape, page_table.shape,
                        cu_q_lens.shape)


# scale shapes the kernel (a compile-time constant of its body): key the executable on it
@tpu_kernel("tpu_kernels::ragged_paged_attention", kind="pallas", supports=_supports,
            static=("scale",))
def ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs,
                           scale=None):
    return rpa.ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens,
                                      num_seqs, scale=scale)
