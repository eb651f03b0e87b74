"""Errors that cannot be raised where they happen, raised at the next chance instead.

torch runs backward ops of a PrivateUse1 device on an autograd worker thread, where an
exception escaping into torch's C++ aborts the whole process (its stream guard calls back
into Python while unwinding). So an error in a tpu op during ``backward()`` is recorded
here, the op returns zeros of the right shape so the engine can finish, and the error is
raised, naming the op, at the next tpu op or synchronisation on the user's thread
(``.item()``, ``.cpu()``, printing, ``torch.tpu.synchronize()``), the way CUDA reports
device-side asserts.
"""
from __future__ import annotations

import threading

import torch

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
    return bool(_pending)


def raise_pending() -> None:
    """Raise the first recorded error (and forget the rest, which it usually caused)."""
    if not _pending:
        return
    with _lock:
        err = _pending[0]
        _pending.clear()
    raise err


def on_worker_thread() -> bool:
    """True on torch's autograd worker thread, while it runs a backward graph."""
    return threading.current_thread() is not threading.main_thread() and \
        torch._C._current_graph_task_id() != -1
