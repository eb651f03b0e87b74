"""Deferred eager mode: same results as eager and CPU, one compiled program per loop step."""
from __future__ import annotations

import copy

import pytest
import torch

import tpu_kernels
from tpu_kernels import deferred_mode
from tpu_kernels.models import CNN, GPT, GPTConfig, train


@pytest.mark.parametrize("make,batch", [
    (lambda: GPT(GPTConfig()), lambda: (torch.randint(0, 256, (4, 33)),)),
    (CNN, lambda: (torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,)))),
], ids=["gpt", "cnn"])
def test_training_matches_cpu_and_compiles_once(make, batch):
    torch.manual_seed(0)
    cpu = make()
    tpu = copy.deepcopy(cpu).to("tpu")
    data = batch()
    expected = train(cpu, data, 10)
    before = deferred_mode.stats()["compiles"]
    got = train(tpu, tuple(t.to("tpu") for t in data), 10, deferred=True)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-4, rtol=1e-4)
    # step 1 creates the optimizer state (a different program); every later step reuses one
    assert deferred_mode.stats()["compiles"] - before <= 3


def test_values_needed_flush_the_recording():
    with tpu_kernels.deferred():
        x = torch.arange(6.0, device="tpu").reshape(2, 3)
        y = (x * 2)[:, 1]
        assert isinstance(y._tpu_storage.array, deferred_mode.Lazy)
        assert y.tolist() == [2.0, 8.0]                        # .cpu() flushes
        z = (x > 2).nonzero()                                  # data-dependent shape flushes
        assert z.shape == (3, 2)
        w = x.sum()
        assert "15." in repr(w)                                # printing flushes
        x.add_(1)                                              # in-place on a recorded value
    assert x.cpu().tolist() == [[1, 2, 3], [4, 5, 6]]


def test_errors_still_raise_in_deferred_mode():
    with tpu_kernels.deferred():
        x = torch.randn(4, device="tpu")
        bad = x.index_select(0, torch.tensor([9], device="tpu"))
    with pytest.raises(IndexError, match="index_select"):
        bad.cpu()


def test_size_limit_flushes(monkeypatch):
    monkeypatch.setattr(deferred_mode, "MAX_NODES", 8)
    before = deferred_mode.stats()["flushes"]
    with tpu_kernels.deferred():
        x = torch.ones(3, device="tpu")
        for _ in range(20):
            x = x + 1
    assert deferred_mode.stats()["flushes"] - before >= 2
    assert x.cpu().tolist() == [21.0, 21.0, 21.0]
