"""Running tpu collectives with a deadline, their handles, and errors that name them.

``run`` starts a collective's program on one daemon thread (collectives keep their
order) and waits at most the group's timeout for it to be dispatched: JAX's CPU
collectives (gloo) block inside the call until every peer joins, and a peer that never
joins must not hang the caller. After a timeout the collective is still pending on that
thread, so the process group cannot be used again: later collectives raise at once.

A collective's results are JAX arrays still being computed; later tpu ops on them are
ordered by data dependence, so nothing needs to wait for correctness. ``wait()`` blocks
until they are ready, or raises once the group's timeout passes, and JAX's runtime errors
(a peer that died: "Connection closed by peer") become errors that say which collective
failed and what to check.
"""
from __future__ import annotations

import collections
import contextlib
import datetime
import queue
import re
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Iterator

import jax
import torch
from torch._C._distributed_c10d import Work

from tpu_kernels.distributed import programs
from tpu_kernels.distributed.groups import Group

# Works C++ holds but Python may not: kept until waited on or their future is taken. Past
# this many, the oldest are dropped (their collectives finished long before).
_LIVE: "collections.OrderedDict[int, TpuWork]" = collections.OrderedDict()
MAX_LIVE = 4096


class CollectiveError(RuntimeError):
    """A tpu collective failed or timed out (a peer process died, hung, or disagreed)."""


def _describe(name: str, group: Group) -> str:
    return f"tpu {name} over ranks {list(group.ranks)} (this is rank {group.ranks[group.rank]})"


# an XLA status ("UNKNOWN: Gloo AllGather failed: ... Connection closed by peer"), which
# JAX raises as JaxRuntimeError or, for some CPU collective failures, as ValueError
_STATUS = re.compile(r"^[A-Z_]+: ")


@contextlib.contextmanager
def failures(name: str, group: Group) -> Iterator[None]:
    """Turn JAX runtime errors raised while running a collective into ``CollectiveError``."""
    try:
        yield
    except (jax.errors.JaxRuntimeError, ValueError) as exc:
        if isinstance(exc, ValueError) and not _STATUS.match(str(exc)):
            raise
        raise CollectiveError(
            f"{_describe(name, group)} failed: {exc}. A peer process probably exited or "
            f"crashed; see its log for the first error") from exc


class _Runner(threading.Thread):
    """The daemon thread collectives are started on (daemon: one stuck in a dead peer's
    collective must not keep the process from exiting)."""

    def __init__(self) -> None:
        super().__init__(name="tpu-collectives", daemon=True)
        self.jobs: "queue.SimpleQueue[tuple[Future, Callable[[], Any]]]" = queue.SimpleQueue()
        self.stuck: str | None = None     # the collective that timed out, if one did

    def run(self) -> None:
        while True:
            future, job = self.jobs.get()
            try:
                future.set_result(job())
            except BaseException as exc:   # handed to the waiting caller
                future.set_exception(exc)


_RUNNER = _Runner()


def run(name: str, group: Group, kind: str, *arrays: Any, **params: Any) -> Any:
    """``programs.run(kind, group.ranks, *arrays, **params)``, started within the group's
    timeout or raising ``CollectiveError`` (see the module docstring)."""
    if _RUNNER.stuck:
        raise CollectiveError(
            f"{_describe(name, group)} not started: the earlier {_RUNNER.stuck} timed out and "
            f"still waits for its peers, so this process's collectives cannot run in order any "
            f"more. Destroy the process group and restart the job (torchrun --max-restarts)")
    if not _RUNNER.is_alive():
        _RUNNER.start()
    future: Future = Future()
    _RUNNER.jobs.put((future, lambda: programs.run(kind, group.ranks, *arrays, **params)))
    with failures(name, group):
        try:
            return future.result(timeout=group.timeout)
        except TimeoutError:
            _RUNNER.stuck = f"{name} over ranks {list(group.ranks)}"
            raise CollectiveError(_timed_out(name, group, group.timeout)) from None


def _timed_out(name: str, group: Group, seconds: float) -> str:
    return (f"{_describe(name, group)} timed out after {seconds:.0f} s: a peer never joined it "
            f"(it exited, hangs, or runs a different collective). Check the other ranks; "
            f"init_process_group(timeout=...) sets the limit")


def wait_ready(arrays: list[jax.Array], name: str, group: Group, seconds: float | None = None) -> None:
    """Block until ``arrays`` are computed, at most ``seconds`` (default: the group's timeout)."""
    deadline = time.monotonic() + (group.timeout if not seconds else seconds)
    delay = 2e-5
    with failures(name, group):
        for a in arrays:
            while not a.is_ready():
                if time.monotonic() > deadline:
                    raise CollectiveError(_timed_out(name, group, seconds or group.timeout))
                time.sleep(delay)
                delay = min(2 * delay, 1e-3)
            a.block_until_ready()    # raises the collective's error, if any


class TpuWork(Work):
    """The handle a tpu collective returns (``async_op=True``, DDP's reducer, ``.wait()``)."""

    def __init__(self, name: str, group: Group, arrays: list[jax.Array], result: Any) -> None:
        super().__init__()
        self._name, self._group, self._arrays, self._result = name, group, arrays, result
        _LIVE[id(self)] = self
        if len(_LIVE) > MAX_LIVE:
            _LIVE.popitem(last=False)

    def _release(self) -> None:
        _LIVE.pop(id(self), None)

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        self._release()
        wait_ready(self._arrays, self._name, self._group, timeout.total_seconds())
        return True

    def is_completed(self) -> bool:
        return all(a.is_ready() for a in self._arrays)

    def is_success(self) -> bool:
        return True

    def result(self) -> Any:
        return self._result

    def get_future(self) -> torch.futures.Future:
        """A future holding the result tensors (complete at once: their values are in flight)."""
        self._release()
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(self._result)
        return fut

    def synchronize(self) -> None:
        self.wait()
