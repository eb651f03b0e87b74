"""Two processes (started by test_failures.py, not torchrun) where rank 1 dies.

    python peer_failure.py      # with RANK, WORLD_SIZE, MASTER_ADDR/PORT set

Rank 1 dies while rank 0 waits in an all_reduce: rank 0's raises, naming it, as soon as
the peer's connection closes. Rank 0 prints one line per event, with the time it took,
for the test to read.
"""
from __future__ import annotations

import datetime
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tpu_kernels  # noqa: E402,F401
from tpu_kernels.distributed.work import CollectiveError  # noqa: E402


def say(*words) -> None:
    print("EVENT", *words, flush=True)


def timed(event: str, fn) -> None:
    start = time.monotonic()
    try:
        fn()
        say(event, "no-error")
    except CollectiveError as e:
        say(event, f"{time.monotonic() - start:.1f}s", str(e).replace("\n", " "))


def main() -> None:
    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t)
    assert t.cpu().tolist() == [2.0] * 4
    say("warm", rank)
    if rank == 1:
        time.sleep(3)                     # rank 0 is inside its all_reduce by then
        os._exit(3)
    timed("dead-peer", lambda: dist.all_reduce(torch.ones(4, device="tpu")))
    sys.stdout.flush()
    os._exit(0)    # JAX's shutdown would wait for the dead peer's heartbeat to time out


if __name__ == "__main__":
    main()
