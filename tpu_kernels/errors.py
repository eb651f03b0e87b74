"""Errors that cannot be raised where they happen, raised at the next chance instead.

Inside torch's autograd engine, an exception escaping a tpu op into torch's C++ aborts
the whole process (the device's stream guard calls back into Python while unwinding),
whichever thread runs the backward graph (tpu backward runs on the calling thread: see
``device._backward_on_the_calling_thread``). So an error in a tpu op during ``backward()`` is recorded
here, the op returns zeros of the right shape so the engine can finish, and the error is
raised, naming the op, at the next tpu op or synchronisation on the user's thread
(``.item()``, ``.cpu()``, printing, ``torch.tpu.synchronize()``), the way CUDA reports
device-side asserts.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Iterator

import jax
import numpy as np
import torch

from tpu_kernels.registry.context import INDEX_CHECKS, Switch, index_checks

__all__ = ["DeferredError", "INDEX_CHECKS", "SYNC_CHECKS", "index_checks", "set_sync_checks", "raise_pending"]

_lock = threading.Lock()
_pending: list[BaseException] = []


class DeferredError(RuntimeError):
    """An error from a tpu op that ran inside ``backward()``, raised at the next sync."""


def defer(exc: BaseException, where: str) -> None:
    err = DeferredError(f"{where} failed during backward(): {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    with _lock:
        _pending.append(err)


def pending() -> bool:
    return bool(_pending) or (SYNC_CHECKS.on and bool(_watched))


def raise_pending() -> None:
    """Raise the first recorded error (and forget the rest, which it usually caused)."""
    if _watched:
        _check_watched()
    if not _pending:
        return
    with _lock:
        err = _pending[0]
        _pending.clear()
    raise err


# -- device-side checks: flags computed with an op's result, read at the next sync ---------
# TPU_KERNELS_SYNC_CHECKS=1: read each op's flags at once (a host sync per checked op).
SYNC_CHECKS = Switch(os.environ.get("TPU_KERNELS_SYNC_CHECKS", "") not in ("", "0"))


def set_sync_checks(on: bool = True) -> Any:
    """Raise device-side check failures at the op that fails (``TPU_KERNELS_SYNC_CHECKS``).

    ``errors.set_sync_checks(True)`` switches for good; ``with errors.set_sync_checks(True):``
    switches for the block. Flags still unread when it is switched on raise at the next op.
    (``index_checks(on)``, from the registry's lowering context, works the same way.)
    """
    return SYNC_CHECKS.set(on)


MAX_WATCHED = 256   # past this many unread flags, the oldest are read (they are done by then)
_watched: list[tuple[Any, str, list]] = []
_held = False   # a graph is being captured: its flags have no values to read yet


def hold_reads(on: bool) -> None:
    """While on, unread flags pile up unread (a graph capture's are placeholders)."""
    global _held
    _held = on


def take_watched(owned: Callable[[Any], bool]) -> list[tuple[Any, str, list]]:
    """Remove and return the watched (flags, op, checks) whose flags ``owned`` claims."""
    with _lock:
        mine = [w for w in _watched if owned(w[0])]
        _watched[:] = [w for w in _watched if not owned(w[0])]
    return mine


def watch(flags: Any, op: Any, checks: list) -> None:
    """Remember an op's check flags (a jax bool vector, one per check in ``checks``);
    ``op``: its name, or the OpOverload (named only if a check fails)."""
    with _lock:
        _watched.append((flags, op, checks))
        overflow = len(_watched) > MAX_WATCHED
    if SYNC_CHECKS.on and not _held:
        raise_pending()
    elif overflow and not _held:
        _check_watched(keep=MAX_WATCHED // 2)


def _check_watched(keep: int = 0) -> None:
    with _lock:
        todo = _watched[: len(_watched) - keep]
        del _watched[: len(_watched) - keep]
    values = _read_all([flags for flags, _, _ in todo])
    for bad, (_, op, checks) in zip(values, todo):
        for hit, (exc, message) in zip(bad, checks):
            if hit:
                with _lock:
                    _pending.append(exc(f"{op}: {message}"))
                return


def in_backward() -> bool:
    """True while torch's autograd engine runs a backward graph on this thread."""
    return torch._C._current_graph_task_id() != -1


_tracing = threading.local()


@contextlib.contextmanager
def tracing_for_tpu() -> Iterator[None]:
    """The ``tpu`` compile backend traces a graph (AOTAutograd runs its backward on fake
    tensors inside torch's autograd engine): an op that fails there on plain tensors is
    kept (``defer``), as one on tpu tensors is, not raised through the engine."""
    old = getattr(_tracing, "on", False)
    _tracing.on = True
    try:
        yield
    finally:
        _tracing.on = old


def keeps_traced_backward_errors() -> bool:
    """An error raised now would cross torch's autograd engine while tpu graphs are traced."""
    return getattr(_tracing, "on", False) and in_backward()


# Flags are read in stacks of _STACK of one shape: on a TPU v5e host, reading 128 flags one
# by one took 30 ms (each a device round trip), ``jax.device_get`` of all 6.5 ms, and one
# jitted stack per shape read once 1.0 ms. A fixed stack size (short stacks padded by
# repeating a flag) keeps the stack programs to one per flag shape.
_STACK = 32


def _read_all(flags: list[Any]) -> list[np.ndarray]:
    """The host values of ``flags`` (jax arrays, or placeholders read one by one)."""
    values: list[Any] = [None] * len(flags)
    groups: dict[tuple, list[int]] = {}
    stacking = len(flags) > 2
    for i, f in enumerate(flags):
        if stacking and isinstance(f, jax.Array):
            groups.setdefault((f.shape, f.dtype, f.sharding), []).append(i)
        else:
            values[i] = np.asarray(f)
    parts = [where[k:k + _STACK] for where in groups.values() for k in range(0, len(where), _STACK)]
    stacks = [_stack(*(flags[i] for i in part), *[flags[part[0]]] * (_STACK - len(part))) for part in parts]
    for part, stacked in zip(parts, jax.device_get(stacks)):    # all stacks' copies at once
        for i, v in zip(part, stacked):
            values[i] = v
    return values


_stack = jax.jit(lambda *flags: jax.numpy.stack(flags))
