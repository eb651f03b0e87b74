"""Deferred eager mode: flushes, errors and limits (training parity with CPU, and one
program per loop step, are tested with the other modes in test_compile_backend.py)."""
from __future__ import annotations

import pytest
import torch

import tpu_kernels
from tpu_kernels import deferred_mode, lazy


def test_values_needed_flush_the_recording():
    with tpu_kernels.deferred():
        x = torch.arange(6.0, device="tpu").reshape(2, 3)
        y = (x * 2)[:, 1]
        assert isinstance(y._tpu_storage.array, lazy.Lazy)
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
    monkeypatch.setattr(lazy, "MAX_NODES", 8)
    before = deferred_mode.stats()["flushes"]
    with tpu_kernels.deferred():
        x = torch.ones(3, device="tpu")
        for _ in range(20):
            x = x + 1
    assert deferred_mode.stats()["flushes"] - before >= 2
    assert x.cpu().tolist() == [21.0, 21.0, 21.0]
