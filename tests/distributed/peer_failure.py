"""Two processes (started by test_failures.py, not torchrun) where rank 1 misbehaves.

1. Rank 1 never joins an all_reduce: rank 0's (with a 3 s timeout) raises a timeout error
   naming the collective.
2. Rank 1 then dies: rank 0's next all_reduce raises at once, naming it, instead of hanging.
Rank 0 prints one line per event, with the time it took, for the test to read.
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


def main() -> None:
    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t)
    assert t.cpu().tolist() == [2.0] * 4
    say("warm", rank)

    if rank == 1:
        time.sleep(8)                      # misses the next collective, then dies
        os._exit(3)
    opts = dist.AllreduceOptions()
    opts.timeout = datetime.timedelta(seconds=3)
    start = time.monotonic()
    try:
        dist.group.WORLD.allreduce([torch.ones(4, device="tpu")], opts).wait()
        say("late-peer", "no-error")
    except CollectiveError as e:
        say("late-peer", f"{time.monotonic() - start:.1f}s", str(e).replace("\n", " "))

    time.sleep(8)                          # rank 1 has exited by now
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4, device="tpu"))
        say("dead-peer", "no-error")
    except CollectiveError as e:
        say("dead-peer", f"{time.monotonic() - start:.1f}s", str(e).replace("\n", " "))
    sys.stdout.flush()
    os._exit(0)    # JAX's shutdown would wait for the dead peer's heartbeat to time out


if __name__ == "__main__":
    main()
