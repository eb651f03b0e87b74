"""Continuous batching: which requests run in the next step, and with how many tokens.

Every step runs each admitted request's pending tokens up to a token budget: one token
for requests that are decoding, a chunk of the prompt for requests still prefilling.
Running requests go first (in admission order), then waiting ones are admitted while a
sequence slot is free and the cache can hold their longest possible context (pages are
reserved at admission, so a running request never runs out of pages). A request retires
when it has its ``max_new_tokens`` or produced ``eos_token_id``; its pages go back.
"""
from __future__ import annotations

import collections
import dataclasses

from tpu_kernels.serving.kv_cache import PageAllocator, pages_for


@dataclasses.dataclass
class Request:
    id: int
    prompt: list[int]
    max_new_tokens: int
    eos_token_id: int | None = None
    output: list[int] = dataclasses.field(default_factory=list)
    computed: int = 0           # tokens whose K/V are in the cache

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def pending(self) -> int:
        """Tokens not yet run through the model."""
        return len(self.prompt) + len(self.output) - self.computed

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_new_tokens or (
            self.eos_token_id is not None and self.output[-1:] == [self.eos_token_id])


@dataclasses.dataclass(frozen=True)
class Scheduled:
    request: Request
    start: int                  # position of the first token run in this step
    num_tokens: int

    @property
    def completes(self) -> bool:
        """Its last token is the request's last known one: this step samples the next."""
        return self.start + self.num_tokens == len(self.request.tokens)


class Scheduler:
    def __init__(self, allocator: PageAllocator, max_num_seqs: int,
                 max_num_batched_tokens: int) -> None:
        self.allocator = allocator
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self._reserved: dict[int, int] = {}      # request id -> pages it may still need

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Scheduled]:
        """The next step's work: (request, first position, token count) per request."""
        budget = self.max_num_batched_tokens
        plan = []
        for req in self.running:
            n = min(req.pending, budget)
            if n:
                plan.append(Scheduled(req, req.computed, n))
                budget -= n
        while self.waiting and budget and len(self.running) < self.max_num_seqs \
                and self._admit(self.waiting[0]):
            req = self.waiting.popleft()
            n = min(req.pending, budget)
            plan.append(Scheduled(req, req.computed, n))
            budget -= n
        return plan

    def slots(self, item: Scheduled) -> list[tuple[int, int]]:
        """Store the step's tokens of ``item`` in the cache: their (page, offset)."""
        req = item.request
        self._reserved[req.id] -= self._grow(req, item.num_tokens)
        return self.allocator.append(req.id, item.num_tokens)

    def finish_step(self, plan: list[Scheduled], next_tokens: list[int | None]) -> list[Request]:
        """Record the step's results; returns the requests that retired."""
        done = []
        for item, tok in zip(plan, next_tokens):
            req = item.request
            req.computed = item.start + item.num_tokens
            if item.completes:
                req.output.append(int(tok))
                if req.finished:
                    done.append(req)
        for req in done:
            self.running.remove(req)
            self.allocator.free(req.id)
            del self._reserved[req.id]
        return done

    def _longest(self, req: Request) -> int:
        # the last sampled token is never run through the model
        return len(req.prompt) + req.max_new_tokens - 1

    def _admit(self, req: Request) -> bool:
        need = pages_for(self._longest(req), self.allocator.page_size)
        if need > self.allocator.num_free - sum(self._reserved.values()):
            if not self.running:
                raise MemoryError(
                    f"request {req.id} needs {need} pages for {self._longest(req)} tokens; "
                    f"the cache has {self.allocator.num_free} free: raise num_pages")
            return False
        self.allocator.allocate(req.id)
        self._reserved[req.id] = need
        self.running.append(req)
        return True

    def _grow(self, req: Request, num_tokens: int) -> int:
        """Pages ``req`` takes from its reservation to store ``num_tokens`` more tokens."""
        ps, held = self.allocator.page_size, len(self.allocator.pages[req.id])
        return pages_for(self.allocator.lengths[req.id] + num_tokens, ps) - held
