"""A peer that dies mid-collective makes the others fail with an error naming the
collective, within seconds, instead of hanging (two processes launched directly,
127.0.0.1)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

from tpu_kernels.distributed import launch

SCRIPT = pathlib.Path(__file__).resolve().parent / "peer_failure.py"


def _launch() -> tuple[dict[str, str], str, float]:
    """Rank 0's events, its output, and the seconds both processes ran."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(launch.free_port()), "WORLD_SIZE": "2",
           "TPU_KERNELS_DIST_HEARTBEAT_S": "10"}
    procs = [subprocess.Popen([sys.executable, str(SCRIPT)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    start = time.monotonic()
    try:
        out, _ = procs[0].communicate(timeout=240)
    finally:
        for p in procs:
            p.kill()
    events = {line.split()[1]: line for line in out.splitlines() if line.startswith("EVENT ")}
    assert "warm" in events, out[-4000:]
    return events, out[-4000:], time.monotonic() - start


def _seconds(event: str) -> float:
    return float(event.split()[2].rstrip("s"))


def test_peer_dying_mid_collective_raises_at_once():
    events, out, _ = _launch()
    dead = events.get("dead-peer", "")
    assert "failed" in dead and "all_reduce" in dead and "no-error" not in dead, out
    # rank 1 dies 3 s into rank 0's all_reduce; its closed socket ends the wait, long
    # before the group's 60 s timeout
    assert _seconds(dead) < 20, dead
