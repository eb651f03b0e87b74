"""Runs inside every torchrun process: many named checks, one JSON result file per rank.

    torchrun --nproc-per-node 2 tests/distributed/harness.py OUT_DIR [--thorough]

Every rank runs the same checks in the same order (collectives must match across ranks);
a check compares tpu results with a single-process computation on CPU torch, which each
rank can do because inputs are drawn from seeds every rank knows. After each check the
ranks agree on its outcome over gloo, so a check that fails on one rank cannot leave the
others waiting inside the next one. pytest (test_torchrun.py) launches this once per
world size, so JAX and torch start once for all checks.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback
from typing import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tpu_kernels  # noqa: E402,F401

CHECKS: list[tuple[str, Callable, tuple[int, ...], bool]] = []   # name, fn, world sizes, thorough
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("TPU_DIST_TEST_TIMEOUT", "180")))


def check(name: str, ci: tuple[int, ...] = (2, 4), thorough: tuple[int, ...] = (2, 4)) -> Callable:
    """Register ``fn()`` as check ``name``: run by CI's launches of world sizes ``ci``, and
    by the thorough launches of sizes ``ci + thorough``."""
    def register(fn: Callable) -> Callable:
        CHECKS.append((name, fn, tuple(ci), tuple(set(ci) | set(thorough))))
        return fn
    return register


def selected(world: int, thorough: bool) -> list[tuple[str, Callable]]:
    return [(n, f) for n, f, ci, every in CHECKS if world in (every if thorough else ci)]


def on_rank0(fn: Callable) -> Callable:
    """``fn()`` computed once, on rank 0, and shared with every rank (reference runs: the
    ranks share two cores, so computing it on each would cost world-size times more)."""
    cache: dict = {}

    def shared():
        if "value" not in cache:
            box = [fn() if dist.get_rank() == 0 else None]
            dist.broadcast_object_list(box, src=0)
            cache["value"] = box[0]
        return cache["value"]
    return shared


def _load_checks() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    for module in ("checks_collectives", "checks_training", "checks_mesh", "checks_errors"):
        __import__(module)


def _agree(ok: bool) -> bool:
    """True when the check passed on every rank (a CPU all-reduce over gloo)."""
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)
    return int(flag) == 0


def main(out_dir: str, thorough: bool) -> None:
    # the 4-process launch names each device's backend (CPU tensors then take torch's own
    # gloo); the 2-process one the tpu backend alone (it serves CPU tensors too)
    backend = "cpu:gloo,tpu:tpu" if os.environ.get("WORLD_SIZE") == "4" else "tpu"
    dist.init_process_group(backend, timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    _load_checks()
    results = {}
    for name, fn in selected(world, thorough):
        start = time.perf_counter()
        error = None
        try:
            fn()
        except Exception:
            error = traceback.format_exc(limit=8)
        everywhere = _agree(error is None)
        results[name] = {"ok": error is None and everywhere, "error": error,
                         "seconds": round(time.perf_counter() - start, 2)}
        if error is None and not everywhere:
            results[name]["error"] = "passed here, failed on another rank"
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":   # the checks register into the importable module, not __main__
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import harness
    harness.main(sys.argv[1], "--thorough" in sys.argv)
