"""Plain jax.numpy reference for ``pallas/ragged_paged_attention.py``: gather each
sequence's pages into a contiguous context, then masked (causal, length) attention.

Every query token gathers its sequence's whole page list ([T, Hkv, P*page_size, D]) and
attends as a batch row of its own (the flash attention reference, boolean mask), so
memory grows with tokens x max context: meant for tests and small batches.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tpu_kernels.pallas.reference import flash_attention as flash_ref


def token_positions(kv_lens: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array,
                    num_tokens: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(sequence, position in it, live) of each of the ``num_tokens`` query rows; rows
    past the live sequences' tokens are not live (their sequence index is clamped)."""
    s = kv_lens.shape[0]
    nseq = jnp.minimum(num_seqs.reshape(-1)[0].astype(jnp.int32), s)
    cu = cu_q_lens.astype(jnp.int32)
    cu = jnp.where(jnp.arange(s + 1) <= nseq, cu, cu[nseq])      # ignore entries past nseq
    tok = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.searchsorted(cu[1:], tok, side="right").astype(jnp.int32)
    live = (seq < nseq) & (tok >= cu[0])
    seq = jnp.minimum(seq, s - 1)
    pos = kv_lens.astype(jnp.int32)[seq] - cu[seq + 1] + tok
    return seq, pos, live


def ragged_paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                           kv_lens: jax.Array, page_table: jax.Array, cu_q_lens: jax.Array,
                           num_seqs: jax.Array, *, scale: float | None = None) -> jax.Array:
    """Same contract as the kernel: q [T, Hq, D], k/v_pages [N, Hkv, page_size, D],
    kv_lens [S], page_table [S, P], cu_q_lens [S+1], num_seqs [1] -> [T, Hq, D]."""
    t, _, d = q.shape
    _, hkv, ps, _ = k_pages.shape
    p = page_table.shape[1]
    seq, pos, live = token_positions(kv_lens, cu_q_lens, num_seqs, t)
    pages = page_table.astype(jnp.int32)[seq]                          # [T, P]

    def context(pages_arr):                                            # [T, Hkv, P*ps, D]
        ctx = pages_arr[pages]                                         # [T, P, Hkv, ps, D]
        return ctx.transpose(0, 2, 1, 3, 4).reshape(t, hkv, p * ps, d)

    keep = (jnp.arange(p * ps)[None, :] <= pos[:, None]) & live[:, None]   # [T, L]
    # each token is a batch row of one query over its sequence's context
    out = flash_ref.attention(q[:, :, None], context(k_pages), context(v_pages),
                              keep[:, None, None, :], scale=scale)
    return out[:, :, 0]
