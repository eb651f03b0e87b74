"""Several Python threads running tpu ops at once get CPU torch's answers."""
from __future__ import annotations

import threading

import torch

from tpu_kernels import dispatch, errors


def _work(seed: int, results: dict, failures: list, rounds: int = 20) -> None:
    try:
        g = torch.Generator().manual_seed(seed)
        n = 4 + seed % 3                        # some threads share shapes (cache keys)
        a, b = torch.randn(n, 8, generator=g), torch.randn(8, n, generator=g)
        idx = torch.randint(0, n, (5,), generator=g)
        out = []
        ta, tb, ti = a.to("tpu"), b.to("tpu"), idx.to("tpu")
        for r in range(rounds):
            y = (ta @ tb).relu() + r
            z = torch.nn.functional.embedding(ti, ta).sum(0).softmax(-1)
            w = ta.index_select(0, ti).t().reshape(-1)[: n] * 2
            out.append((y.cpu(), z.cpu(), w.cpu()))
        want = []
        for r in range(rounds):
            want.append(((a @ b).relu() + r, torch.nn.functional.embedding(idx, a).sum(0).softmax(-1),
                         a.index_select(0, idx).t().reshape(-1)[: n] * 2))
        results[seed] = (out, want)
    except BaseException as exc:  # noqa: BLE001 - reported on the main thread
        failures.append((seed, exc))


def test_threads_get_cpu_results():
    dispatch.clear_cache()          # threads race to build the same entries
    results: dict = {}
    failures: list = []
    threads = [threading.Thread(target=_work, args=(s, results, failures)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    assert len(results) == 6
    for seed, (got, want) in results.items():
        for g, w in zip(got, want):
            for x, y in zip(g, w):
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    info = dispatch.cache_info()["ops"]
    assert info.hits > info.misses


def test_threads_with_random_ops_and_errors_stay_sane():
    failures: list = []
    counts: list = []

    def rand_work():
        try:
            for _ in range(20):
                x = torch.rand(64, device="tpu")
                counts.append(int(((x >= 0) & (x < 1)).sum().item()))
        except BaseException as exc:  # noqa: BLE001
            failures.append(exc)

    threads = [threading.Thread(target=rand_work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    assert counts == [64] * 80
    # distinct draws: the generator's counter is taken under a lock
    draws = [torch.rand(4, device="tpu").cpu() for _ in range(3)]
    assert not torch.equal(draws[0], draws[1])
    # an error from one thread's op surfaces (at a sync), the process stays usable
    try:
        errors.raise_pending()
    except Exception:
        pass
    bad: list = []

    def bad_index():
        try:
            torch.ones(3, device="tpu").index_select(0, torch.tensor([7]).to("tpu")).cpu()
        except IndexError as exc:
            bad.append(exc)

    t = threading.Thread(target=bad_index)
    t.start()
    t.join(60)
    assert len(bad) == 1 and "index_select" in str(bad[0])
    assert (torch.ones(2, device="tpu") * 3).cpu().tolist() == [3.0, 3.0]
