"""Long runs stay healthy: memory and live JAX arrays stay flat, caches stay bounded."""
from __future__ import annotations

import gc

import jax
import psutil
import torch

from tpu_kernels import dispatch
from tpu_kernels.lru import LRU


def _ops() -> int:
    return sum(dispatch.op_counts().values())


def test_training_ops_leave_memory_and_live_arrays_flat(request):
    """3,000 eager training ops after warm-up (10,000 with ``--thorough``): a leak of one
    array or one cache entry per step would show in either count."""
    n_ops = 10_000 if request.config.getoption("--thorough") else 3_000
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(16, 32).to("tpu"), torch.randint(0, 10, (16,)).to("tpu")

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    proc = psutil.Process()
    for _ in range(30):            # warm-up: every executable compiled, momentum buffers made
        step()
    losses = []

    def sample():
        losses.append(step().item())
        gc.collect()
        return proc.memory_info().rss, len(jax.live_arrays())

    rss0, live0 = sample()
    n0 = _ops()
    samples = []
    while _ops() - n0 < n_ops:
        for _ in range(40):
            step()
        samples.append(sample())
    ops = _ops() - n0
    rss = [r for r, _ in samples]
    live = [n for _, n in samples]
    print(f"\n{ops} ops: RSS {rss0 / 2**20:.1f} -> {rss[-1] / 2**20:.1f} MiB "
          f"(max {max(rss) / 2**20:.1f}); live arrays {live0} -> {live[-1]} (max {max(live)})")
    assert ops >= n_ops
    assert max(live) <= live0 * 1.05 + 1, (live0, live)
    assert max(rss) <= rss0 * 1.03, (rss0, rss)      # within 3 % after warm-up
    assert losses[-1] < losses[0]                   # and it trained


def test_executable_cache_is_bounded_with_observable_hit_rate(monkeypatch):
    small = LRU(maxsize=8)
    monkeypatch.setattr(dispatch.cache, "CALLS", small)
    for rep in range(3):
        for n in range(1, 13):       # 12 shapes x (add, mul): more signatures than fit
            a = torch.arange(float(n)).to("tpu")
            assert ((a + 1) * 2).cpu().tolist() == [(i + 1) * 2 for i in range(n)]
    info = dispatch.cache_info()["ops"]
    assert info is not None and info.maxsize == 8
    assert info.size <= 8
    assert info.evictions > 0
    assert info.misses > 0 and 0.0 <= info.hit_rate < 1.0
    # a hot loop on one signature is all hits
    before = small.info()
    a = torch.ones(3).to("tpu")
    for _ in range(50):
        a = a * 1.0
    after = small.info()
    assert after.hits - before.hits >= 49
    assert after.size <= 8
    assert a.cpu().tolist() == [1.0, 1.0, 1.0]


def test_view_cache_is_bounded(monkeypatch):
    small = LRU(maxsize=4)
    monkeypatch.setattr(dispatch.cache, "VIEWS", small)
    x = torch.arange(24.0).to("tpu")
    for n in (1, 2, 3, 4, 6, 8, 12, 24):
        assert x.view(n, -1).cpu().shape == (n, 24 // n)
    info = dispatch.cache_info()["views"]
    assert info.size <= 4 and info.evictions > 0
