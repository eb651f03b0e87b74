"""The guard on compiled code's memory mappings (``code_memory``): XLA crashes once a
process reaches the kernel's limit, so past a fraction of it the executable caches empty,
and everything they held still runs (rebuilt on use)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch

from tpu_kernels import code_memory, lazy
from tpu_kernels.deferred_mode import deferred
from tpu_kernels.dispatch import cache

pytestmark = pytest.mark.skipif(not code_memory.STATE.installed, reason="no /proc/self/maps here")


@pytest.fixture
def guard_everything(monkeypatch):
    """Every executable built is checked, and any count of mappings is over the mark."""
    monkeypatch.setattr(code_memory, "CHECK_EVERY", 1)
    monkeypatch.setattr(code_memory, "HIGH", 1e-9)


def test_an_executable_adds_mappings_and_the_limit_is_read():
    before = code_memory.mappings()
    f = jax.jit(lambda a: jnp.cos(a) * 3.0 + 0.25)
    f(jnp.ones((3, 5))).block_until_ready()
    assert code_memory.mappings() > before > 0
    assert code_memory.limit() >= 1024


def test_past_the_mark_the_op_cache_empties_and_ops_still_run(guard_everything):
    x = torch.randn(7, 11)
    t = x.to("tpu")
    torch.testing.assert_close((t * 2).cpu(), x * 2)     # cached before the guard acts
    reliefs, built = code_memory.STATE.reliefs, code_memory.STATE.built
    torch.testing.assert_close((t + 0.5).exp().cpu(), (x + 0.5).exp())   # new executables
    assert code_memory.STATE.built > built
    assert code_memory.STATE.reliefs > reliefs
    # emptied as the last new executable was built: at most that op is cached now
    assert cache.CALLS.info().size <= 1
    torch.testing.assert_close((t * 2).cpu(), x * 2)     # rebuilt on use


def test_a_deferred_flush_survives_the_caches_emptying_inside_it(guard_everything):
    x = torch.randn(5, 6)
    with deferred():
        t = x.to("tpu")
        y = (t.sin() * 3 + t).sum(0)
        reliefs = code_memory.STATE.reliefs
        got = y.cpu()           # the flush compiles the recording: the guard acts in it
    torch.testing.assert_close(got, (x.sin() * 3 + x).sum(0))
    assert code_memory.STATE.reliefs > reliefs
    assert lazy._PROGRAMS.info().size == 0 and not lazy._AVALS


def test_below_the_mark_nothing_is_emptied(monkeypatch):
    monkeypatch.setattr(code_memory, "CHECK_EVERY", 1)
    t = torch.randn(4, 4).to("tpu")
    (t * 3).cpu()
    size, reliefs = cache.CALLS.info().size, code_memory.STATE.reliefs
    assert not code_memory.relieve_if_above(1.0)
    assert not code_memory.relieve_if_above(0)        # 0: the guard is off
    assert (cache.CALLS.info().size, code_memory.STATE.reliefs) == (size, reliefs)
