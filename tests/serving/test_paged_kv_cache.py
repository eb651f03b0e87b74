"""The engine's bookkeeping without a model: page allocation and continuous batching."""
from __future__ import annotations

import pytest

from tpu_kernels.serving import PageAllocator, Request, Scheduler
from tpu_kernels.serving.kv_cache import PAD_PAGE


def test_allocate_append_free():
    a = PageAllocator(num_pages=6, page_size=4)
    assert a.num_free == 5                                   # page 0 is kept for padding
    assert a.allocate(7, num_tokens=5) == [1, 2]
    assert a.append(7, 3) == [(1, 0), (1, 1), (1, 2)]        # room was reserved already
    assert a.append(7, 7) == [(1, 3), (2, 0), (2, 1), (2, 2), (2, 3), (3, 0), (3, 1)]
    assert a.pages[7] == [1, 2, 3] and a.lengths[7] == 10
    a.allocate(8)
    assert a.append(8, 1) == [(4, 0)]
    a.free(7)
    assert a.num_free == 4 and 7 not in a.pages
    a.append(8, 4)                                           # takes a freed page
    assert a.pages[8] == [4, 1] and PAD_PAGE not in a.pages[8]


def test_out_of_pages_and_double_allocate_say_so():
    a = PageAllocator(num_pages=3, page_size=4)
    a.allocate(0, 8)
    with pytest.raises(MemoryError, match="needs 1 more pages, 0 of 3 are free"):
        a.append(0, 9)
    with pytest.raises(ValueError, match="already holds pages"):
        a.allocate(0)
    with pytest.raises(ValueError, match="at least 2"):
        PageAllocator(1, 4)


def _run(sched, plan, tokens):
    for item in plan:
        sched.slots(item)
    return sched.finish_step(plan, tokens)


def test_decodes_first_then_chunked_prefill_within_the_budget():
    sched = Scheduler(PageAllocator(64, 4), max_num_seqs=3, max_num_batched_tokens=8)
    a, b = Request(0, [1] * 6, 3), Request(1, [2] * 5, 2)
    sched.add(a)
    sched.add(b)
    plan = sched.schedule()                                   # a's prompt, 2 of b's
    assert [(p.request.id, p.start, p.num_tokens) for p in plan] == [(0, 0, 6), (1, 0, 2)]
    assert [p.completes for p in plan] == [True, False]
    assert _run(sched, plan, [11, 99]) == [] and a.output == [11] and b.output == []
    plan = sched.schedule()                                   # a decodes, b finishes prefill
    assert [(p.request.id, p.start, p.num_tokens) for p in plan] == [(0, 6, 1), (1, 2, 3)]
    _run(sched, plan, [12, 21])
    plan = sched.schedule()
    assert [(p.request.id, p.num_tokens) for p in plan] == [(0, 1), (1, 1)]
    done = _run(sched, plan, [13, 22])                        # both reach max_new_tokens
    assert done == [a, b] and a.output == [11, 12, 13] and b.output == [21, 22]
    assert not sched.has_unfinished() and sched.allocator.num_free == 63


def test_admission_waits_for_a_slot_and_for_pages_eos_retires():
    # 9 usable pages of 4 tokens; each request may grow to 4 + 8 - 1 = 11 tokens: 3 pages
    sched = Scheduler(PageAllocator(10, 4), max_num_seqs=2, max_num_batched_tokens=64)
    reqs = [Request(i, [i] * 4, 8, eos_token_id=5) for i in range(4)]
    for r in reqs:
        sched.add(r)
    plan = sched.schedule()
    assert [p.request.id for p in plan] == [0, 1]             # two sequence slots
    _run(sched, plan, [5, 7])                                 # request 0 hits eos
    assert reqs[0].output == [5] and reqs[0] not in sched.running
    plan = sched.schedule()                                   # 1 decodes, 2 is admitted
    assert [p.request.id for p in plan] == [1, 2]
    small = Scheduler(PageAllocator(6, 4), max_num_seqs=4, max_num_batched_tokens=64)
    for r in [Request(i, [1] * 4, 8) for i in range(3)]:
        small.add(r)
    assert [p.request.id for p in small.schedule()] == [0]    # 5 pages: room for one
    with pytest.raises(MemoryError, match="raise num_pages"):
        s = Scheduler(PageAllocator(3, 4), 4, 64)
        s.add(Request(0, [1] * 20, 4))
        s.schedule()
