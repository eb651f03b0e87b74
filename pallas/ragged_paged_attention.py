"""Ragged paged attention (decode and chunked prefill over a paged KV cache), Pallas TPU.

A step of a serving engine attends, for a batch of sequences of different lengths, the
new query tokens of each sequence to its whole context. Tokens are concatenated:
sequence s owns query rows [cu[s], cu[s+1]) of q [T, Hq, D] and has kv_lens[s] context
tokens (its new tokens included, their K/V already written), stored in fixed-size pages
of k/v_pages [N, Hkv, page_size, D] that page_table[s, :] lists in order. Query token t
of s sits at position kv_lens[s] - q_len(s) + (t - cu[s]) and sees context columns up
to it (causal). Decode is q_len 1; chunked prefill several; Hq % Hkv == 0 (GQA).

Grid: blocks i of bq consecutive tokens. For kv head g the block's rows are its tokens
times the rep = Hq/Hkv query heads of g (token-major: the wrapper lays q out as [Hkv,
T*rep, D]), so a head group shares every page it reads. Several sequences may share a
block; each row belongs to one of them.

    m, l, acc <- NEG, 0, 0                     (per kv head and row, f32 VMEM scratch)
    for (s, b) in the block's work items:       s: sequences with rows in block i
      pages of kv block b of s, all kv heads at once (one DMA per page), from HBM into
      one of two VMEM slots; the page table is scalar-prefetched to SMEM, and the next
      item's pages are in flight meanwhile (DMA semaphores per slot)
      for each kv head g:
        S = (Q_g K_gb^T) * scale, kept where the row's token is in s and col <= its position
        m' = max(m, rowmax S); p = exp(S - m'); l = exp(m - m') l + rowsum p
        acc = exp(m - m') acc + p V_gb;  m = m'
    O_block = acc / l                            (rows of no sequence: 0)

Rows outside s keep their state (all their entries are masked: alpha = 1, p = 0), so the
sequences of a block share one set of accumulators. A sequence's items stop at the kv
block holding the causal limit of its last row in the block; pages past a sequence's end
are not fetched (their VMEM rows are zeroed out of V). Each grid step is independent
(its DMA chain starts and drains inside it), so the grid axis is parallel.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info

LANES = 128
NEG = -1e30                 # finite "minus infinity": exp(m_prev - m_new) stays NaN-free
KV_BLOCK_TOKENS = 512       # context tokens per kv block (pages_per_block * page_size)
MAX_PAGES_PER_BLOCK = 32    # page DMAs per kv block are unrolled
PREFILL_ROWS = 128          # q rows (tokens x heads per kv head) per block for prefill
_NT = (((1,), (1,)), ((), ()))   # a @ b^T
_SUPPORTED = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Blocks:
    q_tokens: int           # query tokens per q block (rows = q_tokens * rep)
    pages: int              # pages per kv block


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(x: int, mult: int) -> int:
    return _cdiv(x, mult) * mult


# --- limits, block sizes, VMEM, cost ---------------------------------------------------

def supports(q_shape, q_dtype, k_shape, k_dtype, v_shape, v_dtype, kv_lens_shape,
             page_table_shape, cu_q_lens_shape) -> str | None:
    """None when the kernel handles these operands, else the reason it does not."""
    for dt in (q_dtype, k_dtype, v_dtype):
        if jnp.dtype(dt).name not in _SUPPORTED:
            return f"{jnp.dtype(dt).name} not supported (f32, bf16 only)"
    if not jnp.dtype(q_dtype) == jnp.dtype(k_dtype) == jnp.dtype(v_dtype):
        return "q, k_pages, v_pages dtypes differ"
    if len(q_shape) != 3 or len(k_shape) != 4 or tuple(v_shape) != tuple(k_shape):
        return "expects q [T, Hq, D], k_pages = v_pages [N, Hkv, page_size, D]"
    (t, hq, d), (n, hkv, ps, dk) = q_shape, k_shape
    if len(page_table_shape) != 2 or tuple(kv_lens_shape) != (page_table_shape[0],) \
            or tuple(cu_q_lens_shape) != (page_table_shape[0] + 1,):
        return "expects kv_lens [S], page_table [S, P], cu_q_lens [S + 1]"
    if dk != d:
        return "q and kv head_dim differ"
    if hkv == 0 or hq % hkv:
        return "query heads not a multiple of kv heads"
    if 0 in (t, d, n, ps) or 0 in tuple(page_table_shape):
        return "empty operand"
    if d % LANES:
        return f"head_dim {d} not a multiple of {LANES}"
    sub = tpu_info.sublane(q_dtype)
    if ps % sub:
        return f"page_size {ps} not a multiple of {sub} ({jnp.dtype(q_dtype).name} tile rows)"
    s, p = page_table_shape
    b = choose_blocks(t, s, hkv, hq // hkv, ps, p, d, q_dtype)
    if vmem_bytes(b, hkv, hq // hkv, ps, d, q_dtype) > _budget():
        return f"{hkv} kv heads x head_dim {d} do not fit VMEM at the smallest blocks"
    return None


def _budget() -> int:
    """The smallest VMEM budget of the checked generations: one block choice for all."""
    return min(tpu_info.vmem_budget(tpu_info.CHIPS[g]) for g in tpu_info.CHECKED_GENERATIONS)


def choose_blocks(num_tokens: int, num_seqs: int, num_kv_heads: int, rep: int,
                  page_size: int, pages_per_seq: int, head_dim: int, dtype) -> Blocks:
    """Query tokens per block: the fewest whose rows fill a sublane tile when sequences
    have about one token each (decode: every row of another sequence is wasted work),
    about PREFILL_ROWS rows when they have many. Pages per block: about
    KV_BLOCK_TOKENS context tokens, at most MAX_PAGES_PER_BLOCK DMAs. Until the blocks
    fit the VMEM budget: fewer pages (down to 128 context tokens), then fewer tokens."""
    sub = tpu_info.sublane(dtype)
    unit = sub // math.gcd(rep, sub)               # tokens whose rows fill whole tiles
    per_seq = _cdiv(num_tokens, max(num_seqs, 1))
    want = min(per_seq, max(PREFILL_ROWS // rep, 1))
    b = Blocks(min(_round_up(max(want, 1), unit), _round_up(num_tokens, unit)),
               max(1, min(pages_per_seq, MAX_PAGES_PER_BLOCK, KV_BLOCK_TOKENS // page_size)))
    while vmem_bytes(b, num_kv_heads, rep, page_size, head_dim, dtype) > _budget():
        if b.pages > 1 and (b.pages * page_size > 128 or b.q_tokens == unit):
            b = Blocks(b.q_tokens, b.pages // 2)
        elif b.q_tokens > unit:
            b = Blocks(max(unit, _round_up(b.q_tokens // 2, unit)), b.pages)
        else:
            break
    return b


def vmem_bytes(blocks: Blocks, num_kv_heads: int, rep: int, page_size: int, head_dim: int,
               dtype) -> int:
    """Double-buffered q/o blocks and K/V slots (all kv heads), f32 scratch, and one
    head's (rows, bk) temporaries."""
    rows, bk, isz = blocks.q_tokens * rep, blocks.pages * page_size, jnp.dtype(dtype).itemsize
    h = num_kv_heads
    return (2 * 2 * h * rows * head_dim * isz            # q, o blocks
            + 2 * 2 * h * bk * head_dim * isz            # K, V slots
            + h * (2 * rows * LANES + rows * head_dim) * 4   # m, l, acc
            + 3 * rows * bk * 4)                          # scores, p, mask


def cost(q_lens, kv_lens, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype,
         blocks: Blocks, page_size: int) -> dict[str, float]:
    """Work the kernel does for concrete lengths (Python ints): flops and transcendentals
    over the rows it computes (a block's rows of other sequences included), bytes of the
    pages it fetches and of q and o."""
    rep, isz = num_q_heads // num_kv_heads, jnp.dtype(dtype).itemsize
    rows, bk = blocks.q_tokens * rep, blocks.pages * page_size
    flops = exps = kv_bytes = 0.0
    start = 0
    for ql, kl in zip(q_lens, kv_lens):
        end = start + ql
        for i in range(start // blocks.q_tokens, _cdiv(end, blocks.q_tokens)):
            last = min(end, (i + 1) * blocks.q_tokens) - 1       # last token of s in block
            ctx = kl - ql + (last - start) + 1                   # its causal limit
            nb = _cdiv(ctx, bk)
            flops += num_kv_heads * nb * 4 * rows * bk * head_dim
            exps += num_kv_heads * nb * rows * bk
            pages = min(nb * blocks.pages, _cdiv(kl, page_size))   # whole kv blocks, to the end
            kv_bytes += num_kv_heads * 2 * pages * page_size * head_dim * isz
        start = end
    qo_bytes = 2 * _round_up(start, blocks.q_tokens) * num_q_heads * head_dim * isz
    return {"flops": flops, "transcendentals": exps, "bytes": kv_bytes + qo_bytes}


def _cost_estimate(t: int, s: int, p: int, n: int, hq: int, hkv: int, d: int, ps: int,
                   dtype) -> pl.CostEstimate:
    """Static upper bound for the call: every token attends P*page_size columns, every
    sequence's P pages (at most the whole cache) are read once per kv head."""
    isz = jnp.dtype(dtype).itemsize
    ctx = p * ps
    return pl.CostEstimate(flops=4 * t * hq * d * ctx, transcendentals=t * hq * ctx,
                           bytes_accessed=2 * t * hq * d * isz
                           + 2 * hkv * min(s * p, n) * ps * d * isz)


# --- kernel body ----------------------------------------------------------------------

def _both(f, g):
    f()
    g()


def _cdiv_i32(a, b: int):
    """Ceil division of a non-negative int32 scalar by a Python int (stays int32)."""
    return jax.lax.div(a + jnp.int32(b - 1), jnp.int32(b))


def _kernel(kv_lens_ref, pages_ref, cu_ref, first_ref, nseq_ref,      # SMEM (prefetched)
            q_ref, k_hbm, v_hbm,                                       # q block; pages in HBM
            o_ref,
            kbuf, vbuf, sems, m_sc, l_sc, acc_sc,
            *, bq, rep, ps, ppb, pages_per_seq, max_seqs, scale, precision):
    i = pl.program_id(0)
    bk = ppb * ps
    row_end = (i + 1) * bq                       # one past the block's last token
    nseq = nseq_ref[0]

    def seq(s):
        """(first token, one past last token, context length) of sequence s (clamped)."""
        sc = jnp.minimum(s, max_seqs - 1)
        return cu_ref[sc], cu_ref[sc + 1], kv_lens_ref[sc]

    def in_block(s):
        return (s < nseq) & (cu_ref[jnp.minimum(s, max_seqs)] < row_end)

    def num_blocks(s):
        """kv blocks s needs here: up to the causal limit of its last row in the block."""
        q0, q1, kv_len = seq(s)
        ctx = kv_len - q1 + jnp.minimum(q1, row_end)
        return jnp.where(q1 > q0, _cdiv_i32(ctx, bk), 0)

    def next_item(s, b):
        """The work item after (s, b): the next kv block, else the next sequence that
        needs one (an s past the block ends the walk)."""
        def skip(c):
            return in_block(c[0]) & (c[1] >= num_blocks(c[0]))
        return jax.lax.while_loop(skip, lambda c: (c[0] + 1, jnp.int32(0)), (s, b + 1))

    def copies(s, b, slot):
        """(valid, K copy, V copy) per page of kv block b of s: the page's [Hkv, ps, D]
        into rows j*ps.. of every head's slot."""
        _, _, kv_len = seq(s)
        n_pages = _cdiv_i32(kv_len, ps)
        base = jnp.minimum(s, max_seqs - 1) * pages_per_seq
        out = []
        for j in range(ppb):
            p = b * ppb + j
            page = pages_ref[base + jnp.minimum(p, pages_per_seq - 1)]
            dst = (slot, slice(None), pl.ds(j * ps, ps))
            out.append((p < n_pages,
                        pltpu.make_async_copy(k_hbm.at[page], kbuf.at[dst], sems.at[0, slot]),
                        pltpu.make_async_copy(v_hbm.at[page], vbuf.at[dst], sems.at[1, slot])))
        return out

    def start(s, b, slot):
        for valid, kc, vc in copies(s, b, slot):
            pl.when(valid)(functools.partial(_both, kc.start, vc.start))

    def wait(s, b, slot):
        for valid, kc, vc in copies(s, b, slot):
            pl.when(valid)(functools.partial(_both, kc.wait, vc.wait))

    def attend(s, b, slot):
        q0, q1, kv_len = seq(s)
        shape = (bq * rep, bk)
        tok = i * bq + jax.lax.div(jax.lax.broadcasted_iota(jnp.int32, shape, 0), jnp.int32(rep))
        col = b * bk + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
        keep = (tok >= q0) & (tok < q1) & (col <= kv_len - q1 + tok)
        # rows of V past the context were never fetched (stale VMEM): zero them
        vrow = b * bk + jax.lax.broadcasted_iota(jnp.int32, (bk, vbuf.shape[-1]), 0)
        for g in range(kbuf.shape[1]):
            sc = jax.lax.dot_general(q_ref[g], kbuf[slot, g], _NT, precision=precision,
                                     preferred_element_type=jnp.float32) * scale
            sc = jnp.where(keep, sc, NEG)
            m_prev = m_sc[g]
            m_new = jnp.maximum(m_prev, jnp.max(sc, axis=1, keepdims=True))
            p = jnp.where(keep, jnp.exp(sc - m_new[:, :1]), 0.0)
            alpha = jnp.exp(m_prev - m_new)
            l_sc[g] = alpha * l_sc[g] + jnp.sum(p, axis=1, keepdims=True)
            m_sc[g] = m_new
            v = vbuf[slot, g]
            v = jnp.where(vrow < kv_len, v, jnp.zeros_like(v))
            acc_sc[g] = alpha[:, :1] * acc_sc[g] + jnp.dot(
                p.astype(v.dtype), v, precision=precision, preferred_element_type=jnp.float32)

    m_sc[...] = jnp.full_like(m_sc, NEG)
    l_sc[...] = jnp.zeros_like(l_sc)
    acc_sc[...] = jnp.zeros_like(acc_sc)

    s0, b0 = next_item(first_ref[i], jnp.int32(-1))

    @pl.when(in_block(s0))
    def _():
        start(s0, b0, 0)

    def step(carry):
        s, b, slot = carry
        ns, nb = next_item(s, b)

        @pl.when(in_block(ns))
        def _():
            start(ns, nb, 1 - slot)
        wait(s, b, slot)
        attend(s, b, slot)
        return ns, nb, 1 - slot

    jax.lax.while_loop(lambda c: in_block(c[0]), step, (s0, b0, jnp.int32(0)))
    l = l_sc[...]
    o_ref[...] = (acc_sc[...] / jnp.where(l == 0.0, 1.0, l)[..., :1]).astype(o_ref.dtype)


# --- BlockSpecs, grid, pallas_call ----------------------------------------------------

def _call(q_rows, k_pages, v_pages, meta, *, blocks: Blocks, rep, pages_per_seq, max_seqs,
          scale, cost_estimate, interpret):
    """q_rows [Hkv, Tp*rep, D] (token-major rows per kv head) -> same shape."""
    hkv, nrows, d = q_rows.shape
    ps = k_pages.shape[2]
    bq, ppb = blocks.q_tokens, blocks.pages
    rows, bk = bq * rep, ppb * ps
    qspec = pl.BlockSpec((hkv, rows, d), lambda i, *_: (0, i, 0))
    kernel = functools.partial(
        _kernel, bq=bq, rep=rep, ps=ps, ppb=ppb, pages_per_seq=pages_per_seq,
        max_seqs=max_seqs, scale=scale,
        precision=(jax.lax.Precision.HIGHEST if q_rows.dtype == jnp.float32
                   else jax.lax.Precision.DEFAULT))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(q_rows.shape, q_rows.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(meta),
            grid=(nrows // rows,),
            in_specs=[qspec, pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=qspec,
            scratch_shapes=[pltpu.VMEM((2, hkv, bk, d), k_pages.dtype),
                            pltpu.VMEM((2, hkv, bk, d), v_pages.dtype),
                            pltpu.SemaphoreType.DMA((2, 2)),
                            pltpu.VMEM((hkv, rows, LANES), jnp.float32),
                            pltpu.VMEM((hkv, rows, LANES), jnp.float32),
                            pltpu.VMEM((hkv, rows, d), jnp.float32)],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        cost_estimate=cost_estimate,
        name="ragged_paged_attention",
        interpret=interpret,
    )(*meta, q_rows, k_pages, v_pages)


# --- wrapper --------------------------------------------------------------------------

def _metadata(kv_lens, page_table, cu_q_lens, num_seqs, bq: int, num_blocks: int):
    """int32 scalar-prefetch operands: kv_lens, the flat page table, cu_q_lens (entries
    past num_seqs set to the total), and the first sequence with a token in each q block."""
    s = page_table.shape[0]
    nseq = jnp.minimum(num_seqs.astype(jnp.int32).reshape(-1)[:1], s)
    cu = cu_q_lens.astype(jnp.int32)
    cu = jnp.where(jnp.arange(s + 1, dtype=jnp.int32) <= nseq[0], cu, cu[nseq[0]])
    starts = jnp.arange(num_blocks, dtype=jnp.int32) * bq
    first = jnp.searchsorted(cu[1:], starts, side="right").astype(jnp.int32)
    return (kv_lens.astype(jnp.int32), page_table.astype(jnp.int32).reshape(-1), cu,
            first, nseq)


def ragged_paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                           kv_lens: jax.Array, page_table: jax.Array, cu_q_lens: jax.Array,
                           num_seqs: jax.Array, *, scale: float | None = None,
                           blocks: Blocks | None = None,
                           interpret: bool | pltpu.InterpretParams | None = None) -> jax.Array:
    """Causal attention of each sequence's new tokens to its paged context.

    q [T, Hq, D] (sequence s owns rows cu_q_lens[s]:cu_q_lens[s+1]); k_pages, v_pages
    [N, Hkv, page_size, D]; kv_lens [S] context lengths (new tokens included);
    page_table [S, P] page ids in order; cu_q_lens [S+1] non-decreasing; num_seqs [1]:
    only the first num_seqs sequences are live. Rows of no live sequence give 0.
    scale defaults to 1/sqrt(D). ``interpret``: None picks interpret mode off TPU; a
    ``pltpu.InterpretParams`` runs TPU interpret mode (DMAs, semaphores, NaN-filled
    uninitialised VMEM, out-of-bounds checks).
    """
    reason = supports(q.shape, q.dtype, k_pages.shape, k_pages.dtype, v_pages.shape,
                      v_pages.dtype, kv_lens.shape, page_table.shape, cu_q_lens.shape)
    if reason:
        raise ValueError(
            f"pallas ragged_paged_attention: {reason} (q {q.shape} {q.dtype}, k_pages "
            f"{k_pages.shape} {k_pages.dtype}, page_table {page_table.shape}); "
            f"use the XLA reference for these inputs")
    t, hq, d = q.shape
    n, hkv, ps, _ = k_pages.shape
    s, p = page_table.shape
    rep = hq // hkv
    blocks = blocks or choose_blocks(t, s, hkv, rep, ps, p, d, q.dtype)
    tp = _round_up(t, blocks.q_tokens)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    with jax.enable_x64(False):
        meta = _metadata(kv_lens, page_table, cu_q_lens, num_seqs, blocks.q_tokens,
                         tp // blocks.q_tokens)
        qp = jnp.pad(q, ((0, tp - t), (0, 0), (0, 0))) if tp != t else q
        rows = qp.reshape(tp, hkv, rep, d).transpose(1, 0, 2, 3).reshape(hkv, tp * rep, d)
        out = _call(rows, k_pages, v_pages, meta, blocks=blocks, rep=rep, pages_per_seq=p,
                    max_seqs=s, scale=scale,
                    cost_estimate=_cost_estimate(t, s, p, n, hq, hkv, d, ps, q.dtype),
                    interpret=tpu_info.target(interpret).interpret)
    out = out.reshape(hkv, tp, rep, d).transpose(1, 0, 2, 3).reshape(tp, hq, d)
    return out[:t]
