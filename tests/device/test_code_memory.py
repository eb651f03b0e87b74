"""The guard on compiled code's memory mappings (``code_memory``): XLA crashes once a
process reaches the kernel's limit, so past a fraction of it the executable caches empty,
and everything they held still runs (rebuilt on use)."""
from __future__ import annotations

import subprocess
import sys

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


_NEAR_THE_LIMIT = r"""
import mmap, sys
import torch, tpu_kernels
from tpu_kernels import code_memory
cap, margin = code_memory.limit(), int(sys.argv[2])
# the mark just past where the process starts, a check every 64 executables (~300 mappings)
code_memory.HIGH, code_memory.CHECK_EVERY = (cap - margin + 300) / cap, 64
keep = []
while code_memory.mappings() < cap - margin:      # other mappings fill all but the margin
    for i in range(min(1000, cap - margin - code_memory.mappings())):
        keep.append(mmap.mmap(-1, 4096, prot=mmap.PROT_READ | (mmap.PROT_WRITE * (i % 2))))
for n in range(1, 1 + int(sys.argv[1])):          # an executable (or more) a shape
    assert (torch.ones(n, 2, device="tpu") * 3).sum().item() == 6 * n
print(code_memory.STATE.reliefs, code_memory.mappings(), cap)
"""


def test_a_process_near_the_limit_keeps_compiling():
    """Without the guard, the executables of 150 shapes (3-6 mappings each) overrun the
    1,250 mappings left, and XLA segfaults ("LLVM compilation error: Cannot allocate
    memory"); with it, the caches empty as the mark is passed and every op runs."""
    p = subprocess.run([sys.executable, "-c", _NEAR_THE_LIMIT, "150", "1250"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    reliefs, now, cap = map(int, p.stdout.split())
    assert reliefs >= 1 and now < cap


def test_emptying_also_drops_the_executables_jax_keeps_itself():
    """JAX caches executables of its own (an operation applied outside any jit keeps one):
    a process that ran sixteen transformers models kept ~5,000 of them once the runtime's
    caches were emptied, and one that ran ~50 stayed above the limit's mark after the guard."""
    for n in range(1, 41):
        jnp.sin(jnp.ones((n, 3))).block_until_ready()     # executables only JAX holds
    before = code_memory.mappings()
    torch.tpu.empty_cache()
    assert code_memory.mappings() < before - 80
