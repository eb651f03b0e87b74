"""torch's Python meta functions without importing ``torch._dynamo`` (about 0.4 s, once).

Many of torch's Python meta functions and references are wrapped in
``torch._disable_dynamo``, which imports ``torch._dynamo`` on the wrapped function's
first call to build ``torch._dynamo.disable(fn)`` and keeps it on ``fn.__dynamo_disable``.
That wrapper only matters while dynamo traces a frame, and dynamo cannot trace one
before it is imported. So each such function found in torch's meta and decomposition
tables and in its reference modules gets, in ``__dynamo_disable``, a stand-in that
calls the function directly while ``torch._dynamo`` is not imported, and from the first
call after it is, builds the real ``disable`` and puts it in its own place. A function
missed here behaves as before (it imports dynamo on its first call).
"""
from __future__ import annotations

import sys
import types
from typing import Callable

import torch

from tpu_kernels.untraced import until_dynamo

# the modules whose functions torch's meta functions call directly (not through ops)
_MODULES = ("torch._refs", "torch._prims", "torch._decomp", "torch._meta_registrations")
_done = False
_GIVEN: list[Callable] = []   # the functions given a stand-in


def prepare() -> None:
    """Idempotent: give every ``_disable_dynamo`` wrapper found its stand-in (a few ms)."""
    global _done
    if _done:
        return
    _done = True
    if "torch._dynamo" in sys.modules:
        return
    code = torch._compile._disable_dynamo(lambda: None).__code__
    seen: set[int] = set()
    todo = list(_candidates())
    while todo:   # through wrappers: ``__wrapped__`` and the functions their closures hold
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if getattr(fn, "__code__", None) is code:
            _stand_in(fn)
        inner = getattr(fn, "__wrapped__", None)
        if inner is not None:
            todo.append(inner)
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:   # an empty cell
                continue
            if isinstance(v, types.FunctionType):
                todo.append(v)


def _candidates():
    from torch._decomp import global_decomposition_table
    for table in global_decomposition_table.values():
        yield from (v for v in table.values() if isinstance(v, types.FunctionType))
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(_MODULES):
            yield from (v for v in list(vars(module).values()) if isinstance(v, types.FunctionType))


def _stand_in(inner: Callable) -> None:
    cells = dict(zip(inner.__code__.co_freevars, inner.__closure__ or ()))
    if "fn" not in cells or "recursive" not in cells:
        return   # not the wrapper this module knows: leave it alone
    fn, recursive = cells["fn"].cell_contents, cells["recursive"].cell_contents
    if getattr(fn, "__dynamo_disable", None) is None:
        setattr(fn, "__dynamo_disable", until_dynamo(fn, recursive))
        _GIVEN.append(fn)


def standing() -> tuple[int, int]:
    """(functions given a stand-in, those whose stand-in has not yet been replaced)."""
    return len(_GIVEN), sum(getattr(f, "__dynamo_disable").__name__ == "_stand_in_call" for f in _GIVEN)
