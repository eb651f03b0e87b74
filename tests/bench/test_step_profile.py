"""The step profiler's executable count leaves JAX as it found it: calls after the counting
steps take JAX's C++ fast path again (they went down its Python path, about 3x the host
cost a call, and inflated the profile's "exe alone" times, measured after the count)."""
from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
from jax._src.interpreters import pxla

from tpu_kernels.bench import step_profile


def _python_path_calls(f, x, calls: int = 5) -> int:
    """How many of ``calls`` calls of jitted ``f`` ran through JAX's Python execute path."""
    seen = [0]
    execute = pxla.ExecuteReplicated.__call__

    def counted(self, *args):
        seen[0] += 1
        return execute(self, *args)
    pxla.ExecuteReplicated.__call__ = counted
    try:
        for _ in range(calls):
            f(x).block_until_ready()
    finally:
        pxla.ExecuteReplicated.__call__ = execute
    return seen[0]


def test_counting_counts_executables_and_then_gives_the_fast_path_back():
    f = jax.jit(lambda x: x * 2 + 1)
    x = jnp.ones(8)
    f(x)
    assert _python_path_calls(f, x) == 0          # warm: the C++ fast path
    counts: collections.Counter = collections.Counter()
    with step_profile._counted(counts):
        f(x)
        f(x)
    assert sum(n for k, n in counts.items() if k.startswith("executable")) == 2
    f(x)                                           # (the first call after it fills the cache)
    assert _python_path_calls(f, x) == 0
