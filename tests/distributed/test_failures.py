"""A peer that is late or dies makes the others fail with an error naming the collective,
within a timeout, instead of hanging (two processes launched directly, 127.0.0.1)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

from tpu_kernels.distributed import launch

SCRIPT = pathlib.Path(__file__).resolve().parent / "peer_failure.py"


def _events(output: str) -> dict[str, str]:
    return {line.split()[1]: line for line in output.splitlines() if line.startswith("EVENT ")}


def test_late_and_dead_peer_raise_instead_of_hanging():
    port = launch.free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "WORLD_SIZE": "2", "TPU_KERNELS_DIST_HEARTBEAT_S": "10"}
    procs = [subprocess.Popen([sys.executable, str(SCRIPT)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    start = time.monotonic()
    try:
        out0, _ = procs[0].communicate(timeout=240)
    finally:
        for p in procs:
            p.kill()
    elapsed = time.monotonic() - start
    events = _events(out0)
    assert "warm" in events, out0[-4000:]
    late = events.get("late-peer", "")
    assert "timed out after 3 s" in late and "all_reduce" in late, out0[-4000:]
    dead = events.get("dead-peer", "")
    assert "failed" in dead and "all_reduce" in dead and "no-error" not in dead, out0[-4000:]
    seconds = float(dead.split()[2].rstrip("s"))
    assert seconds < 30, dead      # the peer's socket closed: no waiting for the group timeout
    assert procs[1].wait(timeout=5) == 3
    assert elapsed < 240
