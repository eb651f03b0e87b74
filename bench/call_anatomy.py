"""What one executable call costs on this machine, split into launch, inputs and outputs.

    python -m tpu_kernels.bench.call_anatomy [--reps 60] [--counts 1,8,32,128,256]

Plain JAX (no torch, nothing of this project): jitted functions of n 64x64 float32
arrays, each case timed three ways (µs per call, medians):

- ``waited``: one call, waited for (a device round trip each);
- ``dispatch``: the host time of a call when calls follow each other (``--reps`` calls,
  not waited for; the previous call's outputs are freed as the next one's arrive);
- ``pipelined``: the same calls with the final wait, per call;
- ``after work``: ``dispatch`` when each call follows ~10 µs of allocating Python (a dict
  of 60 small tuples, as a compiled call's Dynamo frame, guards and wrappers run between
  two launches), the work's own time (timed alone in the same run) taken out.

Cases (inputs -> outputs): ``each n->n`` (``x + 1`` of each input), donated or not;
``sum n->1``; ``fan-out 1->n``; ``each 0-dim n->n``. A compiled training step
is a few such calls (the forward, backward and optimizer programs, ``step_profile.py``),
so these costs bound what it can reach: on the TPU v5e host (session 24) a call costs
about 110 µs, each output about 5.5 µs more and each input about 1 µs
(``bench/results/tpu_v5e/``).

Back-to-back calls flatter the launch: on that host (session 35) an add's executable took
122 µs a call back to back, 2 µs more after a 50 µs busy wait, but 29 µs more after the
allocating work above and 65 µs more right after a Dynamo frame that runs nothing (the
same code on the 2-core CPU machine: +9 and +19 µs, partly XLA:CPU waking its threads).
The launch itself is host work that runs slower on a cold cache: Python between launches
costs more than its own time (``2026-12-06-s35.md``).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp


def timed(fn: Callable, make_args: Callable[[], list], reps: int) -> tuple[float, float, float]:
    """(waited, dispatch, pipelined) µs per call of ``fn`` on fresh ``make_args()``."""
    jax.block_until_ready(fn(*make_args()))
    waits = []
    for _ in range(reps):
        args = make_args()
        jax.block_until_ready(args)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        waits.append(time.perf_counter() - t0)
    calls = [make_args() for _ in range(reps)]
    jax.block_until_ready(calls)
    t0 = time.perf_counter()
    for args in calls:
        out = fn(*args)
    t1 = time.perf_counter()
    jax.block_until_ready(out)
    t2 = time.perf_counter()
    return statistics.median(waits) * 1e6, (t1 - t0) / reps * 1e6, (t2 - t0) / reps * 1e6


def python_work() -> dict:
    """About 10 µs of allocating Python (``after work``'s stretch between two calls)."""
    return {i: (i, str(i), [i]) for i in range(60)}


def after_work(fn: Callable, make_args: Callable[[], list], reps: int) -> float:
    """µs per call of ``fn`` when each call follows ``python_work()`` (its time taken out)."""
    calls = [make_args() for _ in range(reps)]
    jax.block_until_ready(calls)
    t0 = time.perf_counter()
    for _ in calls:
        python_work()
    t1 = time.perf_counter()
    for args in calls:
        python_work()
        out = fn(*args)
    t2 = time.perf_counter()
    jax.block_until_ready(out)
    return ((t2 - t1) - (t1 - t0)) / reps * 1e6   # (a difference: noise can make it negative)


def cases(n: int) -> dict[str, tuple[Callable, Callable[[], list]]]:
    """The jitted functions of ``n`` arrays and how to make their arguments."""
    xs = [jnp.full((64, 64), float(i), jnp.float32) for i in range(n)]
    scalars = [jnp.float32(i) for i in range(n)]

    def each(*a):
        return [t + 1 for t in a]
    return {
        f"each {n}->{n}": (jax.jit(each), lambda: xs),
        f"each {n}->{n} donated": (jax.jit(each, donate_argnums=tuple(range(n))),
                                   lambda: [jnp.array(t, copy=True) for t in xs]),
        f"sum {n}->1": (jax.jit(lambda *a: sum(t.sum() for t in a)), lambda: xs),
        f"fan-out 1->{n}": (jax.jit(lambda t: [t * i for i in range(n)]), lambda: xs[:1]),
        f"each 0-dim {n}->{n}": (jax.jit(each), lambda: scalars),
    }


def run(counts: list[int], reps: int = 60, out=print) -> list[dict]:
    out(f"device: {jax.devices()[0].device_kind} ({jax.devices()[0].platform})")
    out(f"{'case':<26} {'waited':>9} {'dispatch':>9} {'pipelined':>10} {'after work':>11}   (µs per call)")
    rows = []
    for n in counts:
        for name, (fn, make_args) in cases(n).items():
            w, d, p = timed(fn, make_args, reps)
            a = after_work(fn, make_args, reps)
            rows.append({"case": name, "waited_us": w, "dispatch_us": d, "pipelined_us": p, "after_work_us": a})
            out(f"{name:<26} {w:>9.1f} {d:>9.1f} {p:>10.1f} {a:>11.1f}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--counts", default="1,8,32,128,256")
    a = p.parse_args()
    run([int(c) for c in a.counts.split(",")], a.reps)


if __name__ == "__main__":
    main()
