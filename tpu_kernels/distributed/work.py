"""Running tpu collectives, their handles, and errors that name them.

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
import re
import time
from typing import Any, Iterator

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


def run(name: str, group: Group, kind: str, *arrays: Any, **params: Any) -> Any:
    """``programs.run(kind, group.ranks, *arrays, **params)``, its failures raised as
    ``CollectiveError`` naming the collective."""
    with failures(name, group):
        return programs.run(kind, group.ranks, *arrays, **params)


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
