"""Device-side errors: checks that need values are raised at the next synchronisation."""
from __future__ import annotations

_pending: list[Exception] = []


def raise_pending() -> None:
    if _pending:
        err = _pending.pop(0)
        _pending.clear()
        raise err
