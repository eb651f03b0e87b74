"""Launch helpers: run a script under ``torchrun`` on this host (127.0.0.1, a free port).

    from tpu_kernels.distributed import launch
    result = launch.torchrun("train.py", nproc=2, timeout=300)
    print(result.returncode, result.output)

Each process gets torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, ...); ``dist.init_process_group("tpu")`` in the script starts JAX's
distributed runtime from it. On a machine without a TPU every process uses the CPU
(``JAX_PLATFORMS=cpu``) and the collectives run over gloo.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from typing import Sequence


@dataclasses.dataclass
class Result:
    returncode: int
    output: str          # stdout and stderr of every process, interleaved as written
    timed_out: bool = False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def command(script: str, nproc: int, args: Sequence[str] = (), port: int | None = None) -> list[str]:
    """The ``torchrun`` command line for ``nproc`` processes of ``script`` on this host."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(port or free_port()),
            "--max-restarts", "0", script, *args]


def torchrun(script: str, nproc: int, args: Sequence[str] = (), *, timeout: float = 600,
             env: dict[str, str] | None = None) -> Result:
    """Run ``script`` in ``nproc`` processes; returns when all exit or ``timeout`` passes
    (then the whole process group is killed)."""
    environ = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
               "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(command(script, nproc, args), env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return Result(proc.returncode, out)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        return Result(-9, out, timed_out=True)
