"""Reading device-side check flags to the host: one by one, ``jax.device_get``, and
``errors._read_all`` (one jitted stack per 32 flags of a shape, read once).

    python -m tpu_kernels.bench.flag_reads [--flags 128] [--rounds 5]

Every op with device-side checks (index bounds, cross-entropy targets) returns a small bool
array; the runtime reads them past ``errors.MAX_WATCHED`` unread, or at a sync. On a TPU
each read alone is a device round trip (results: ``results/tpu_v5e/2026-12-04-s23.md``).
Prints ms per batch of ``--flags`` flags (two shapes, as a mix of ops gives), median of
``--rounds``, each batch fresh and finished before it is read.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels import errors


@jax.jit
def _checks(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x > 5, jnp.stack([x[0] > 1, x[1] < 0])


def _batch(n: int) -> list[jax.Array]:
    x = jnp.arange(10.0)
    flags = [f for _ in range(n // 2) for f in _checks(x)]
    return jax.block_until_ready(flags)


READERS: dict[str, Callable[[list], list]] = {
    "one by one": lambda fs: [np.asarray(f) for f in fs],
    "device_get": jax.device_get,
    "stacked (errors._read_all)": errors._read_all,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flags", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    print(f"{a.flags} flags on {jax.devices()[0].platform}, ms per batch (median of {a.rounds})")
    for name, read in READERS.items():
        read(_batch(a.flags))     # warm-up: compiles the stacks
        times = []
        for _ in range(a.rounds):
            flags = _batch(a.flags)
            t0 = time.perf_counter()
            read(flags)
            times.append(time.perf_counter() - t0)
        print(f"  {name:<28} {statistics.median(times) * 1e3:8.2f}")


if __name__ == "__main__":
    main()
