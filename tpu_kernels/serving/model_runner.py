"""One engine step through a Hugging Face Llama-shaped decoder, attention over the paged
cache with ``tpu_kernels::ragged_paged_attention``.

The step takes the batch's new tokens concatenated (``[T]``, padded to a bucket so a
compiled step sees few shapes), writes their K/V into their cache slots, and returns the
greedy next token of every sequence's last row. The model's own modules do the rest
(embeddings, norms, projections, MLPs, rotary tables); only the attention call is the
engine's. Models: Llama, Mistral (no sliding window), Qwen2, Qwen3 and their kin whose
layers have ``self_attn.{q,k,v,o}_proj`` and pre-norms.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from tpu_kernels.serving.kv_cache import PAD_PAGE, PagedKVCache
from tpu_kernels.serving.scheduler import Scheduled

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


@dataclasses.dataclass
class StepInputs:
    """Tensors of one step (host side until ``to``)."""
    input_ids: torch.Tensor      # [T] int64, padded
    positions: torch.Tensor      # [T] int64
    slot_page: torch.Tensor      # [T] int64: cache page of each token's K/V
    slot_offset: torch.Tensor    # [T] int64
    kv_lens: torch.Tensor        # [S] int32
    page_table: torch.Tensor     # [S, P] int32
    cu_q_lens: torch.Tensor      # [S + 1] int32
    num_seqs: torch.Tensor       # [1] int32
    last_rows: torch.Tensor      # [S] int64: each sequence's last row

    def to(self, device: Any) -> "StepInputs":
        return StepInputs(**{f.name: getattr(self, f.name).to(device)
                             for f in dataclasses.fields(self)})


def check_model(model: torch.nn.Module) -> None:
    """Refuse models whose attention the step would compute wrongly, saying why."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED:
        raise NotImplementedError(f"serving engine: model_type {cfg.model_type!r} is not "
                                  f"Llama-shaped; supported: {', '.join(SUPPORTED)}")
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        raise NotImplementedError(f"serving engine: sliding-window attention "
                                  f"(sliding_window={cfg.sliding_window}) is not supported")


def head_dim(cfg: Any) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def build_inputs(plan: list[Scheduled], slots: list[list[tuple[int, int]]],
                 page_lists: list[list[int]], num_tokens: int, max_num_seqs: int,
                 pages_per_seq: int) -> StepInputs:
    """The step's tensors for ``plan`` padded to ``num_tokens`` rows and ``max_num_seqs``."""
    ids, pos, page, off = ([0] * num_tokens for _ in range(4))
    page = [PAD_PAGE] * num_tokens
    kv_lens, cu, last = [0] * max_num_seqs, [0] * (max_num_seqs + 1), [0] * max_num_seqs
    table = torch.full((max_num_seqs, pages_per_seq), PAD_PAGE, dtype=torch.int32)
    row = 0
    for s, (item, seq_slots, pages) in enumerate(zip(plan, slots, page_lists)):
        tokens = item.request.tokens
        for j in range(item.num_tokens):
            ids[row + j] = tokens[item.start + j]
            pos[row + j] = item.start + j
            page[row + j], off[row + j] = seq_slots[j]
        row += item.num_tokens
        kv_lens[s], cu[s + 1], last[s] = item.start + item.num_tokens, row, row - 1
        table[s, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
    for s in range(len(plan), max_num_seqs):
        cu[s + 1] = row
    i64, i32 = torch.int64, torch.int32
    return StepInputs(torch.tensor(ids, dtype=i64), torch.tensor(pos, dtype=i64),
                      torch.tensor(page, dtype=i64), torch.tensor(off, dtype=i64),
                      torch.tensor(kv_lens, dtype=i32), table, torch.tensor(cu, dtype=i32),
                      torch.tensor([len(plan)], dtype=i32), torch.tensor(last, dtype=i64))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class ModelRunner:
    """Runs steps of ``model`` (a ``*ForCausalLM``) against ``cache``."""

    def __init__(self, model: torch.nn.Module, cache: PagedKVCache, compile: bool = True) -> None:
        check_model(model)
        self.model, self.cache = model, cache
        self.head_dim = head_dim(model.config)
        self._step = (torch.compile(self.forward, backend="tpu", fullgraph=True, dynamic=False)
                      if compile else self.forward)

    @torch.no_grad()
    def __call__(self, inputs: StepInputs) -> torch.Tensor:
        """Greedy next token of each sequence slot ([S]; slots past num_seqs are junk)."""
        return self._step(inputs.to(self.cache.k[0].device), self.cache.k, self.cache.v)

    def forward(self, x: StepInputs, k_cache: list[torch.Tensor],
                v_cache: list[torch.Tensor]) -> torch.Tensor:
        lm = self.model.model
        t, d = x.input_ids.shape[0], self.head_dim
        h = lm.embed_tokens(x.input_ids)
        cos, sin = lm.rotary_emb(h[None], x.positions[None])
        cos, sin = cos[0, :, None], sin[0, :, None]                        # [T, 1, D]
        for i, layer in enumerate(lm.layers):
            attn = layer.self_attn
            a = layer.input_layernorm(h)
            q = attn.q_proj(a).view(t, -1, d)
            k = attn.k_proj(a).view(t, -1, d)
            v = attn.v_proj(a).view(t, -1, d)
            if hasattr(attn, "q_norm"):                                     # Qwen3
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k_cache[i][x.slot_page, :, x.slot_offset] = k        # [T, Hkv, D]
            v_cache[i][x.slot_page, :, x.slot_offset] = v
            o = torch.ops.tpu_kernels.ragged_paged_attention(
                q, k_cache[i], v_cache[i], x.kv_lens, x.page_table, x.cu_q_lens, x.num_seqs,
                attn.scaling)
            h = h + attn.o_proj(o.reshape(t, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = self.model.lm_head(lm.norm(h[x.last_rows]))
        return logits.argmax(-1)
