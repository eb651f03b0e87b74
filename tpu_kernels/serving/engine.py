"""The engine loop: schedule a step, run it, record its tokens, retire finished requests.

    engine = Engine(model.to("tpu"), EngineConfig(page_size=16, num_pages=256))
    outputs = engine.generate([[1, 2, 3], [4, 5]], max_new_tokens=32)   # greedy token ids

Requests can also be added between steps (``add_request``), as a server would.
"""
from __future__ import annotations

import dataclasses
import itertools

import torch

from tpu_kernels.serving.kv_cache import PagedKVCache, pages_for
from tpu_kernels.serving.model_runner import ModelRunner, build_inputs, head_dim
from tpu_kernels.serving.scheduler import Request, Scheduler


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    page_size: int = 16
    num_pages: int = 256
    max_num_seqs: int = 8             # sequences per step
    max_num_batched_tokens: int = 64  # tokens per step
    max_model_len: int = 512          # prompt + generated tokens of one request
    compile: bool = True              # run steps under torch.compile(backend="tpu")

    def buckets(self) -> tuple[int, ...]:
        """Padded token counts of a step: decode-only steps, and any other."""
        return tuple(sorted({min(self.max_num_seqs, self.max_num_batched_tokens),
                             self.max_num_batched_tokens}))


@dataclasses.dataclass
class EngineStats:
    steps: int = 0
    tokens: int = 0                   # rows run through the model (padding excluded)
    generated: int = 0


class Engine:
    def __init__(self, model: torch.nn.Module, config: EngineConfig = EngineConfig()) -> None:
        cfg = model.config
        device = next(model.parameters()).device
        self.config = config
        self.cache = PagedKVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim(cfg),
                                  config.num_pages, config.page_size,
                                  next(model.parameters()).dtype, device)
        self.scheduler = Scheduler(self.cache.allocator, config.max_num_seqs,
                                   config.max_num_batched_tokens)
        self.runner = ModelRunner(model, self.cache, compile=config.compile)
        self.stats = EngineStats()
        self._ids = itertools.count()

    def add_request(self, prompt: list[int], max_new_tokens: int,
                    eos_token_id: int | None = None) -> Request:
        if not prompt or max_new_tokens < 1:
            raise ValueError("add_request: needs a non-empty prompt and max_new_tokens >= 1")
        if len(prompt) + max_new_tokens > self.config.max_model_len:
            raise ValueError(f"add_request: {len(prompt)} prompt + {max_new_tokens} new tokens "
                             f"exceed max_model_len={self.config.max_model_len}")
        req = Request(next(self._ids), list(prompt), max_new_tokens, eos_token_id)
        self.scheduler.add(req)
        return req

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[Request]:
        """Run one step; returns the requests that finished in it."""
        sched, cfg = self.scheduler, self.config
        plan = sched.schedule()
        slots = [sched.slots(item) for item in plan]
        n = sum(item.num_tokens for item in plan)
        bucket = next(b for b in cfg.buckets() if b >= n)
        inputs = build_inputs(plan, slots, [self.cache.allocator.pages[i.request.id] for i in plan],
                              bucket, cfg.max_num_seqs, pages_for(cfg.max_model_len, cfg.page_size))
        tokens = self.runner(inputs).tolist()
        self.stats.steps += 1
        self.stats.tokens += n
        self.stats.generated += sum(item.completes for item in plan)
        return sched.finish_step(plan, tokens)

    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 eos_token_id: int | None = None) -> list[list[int]]:
        """Greedy continuations of ``prompts`` (token ids), batched continuously."""
        reqs = [self.add_request(p, max_new_tokens, eos_token_id) for p in prompts]
        while self.has_unfinished():
            self.step()
        return [r.output for r in reqs]
