"""Parity through ``torch.compile(backend="tpu")``: the compiler as one more impl.

Each op with a strategy runs as a one-op compiled function (``fullgraph=True``: a graph
break is a failure, not a silent eager fallback), forward and, for tier-1 float cases,
backward, against CPU torch with the same tolerance table and known-failures list as
test_parity.py (key ``<op>|compile:tpu``). Every op with a strategy is a case: one drawn
call in the ``ci`` profile, 10 in ``thorough``. CI runs a fixed quarter of the tier-1 ops'
cases (every listed known failure among them: ``known.in_ci_sample``; about 30
worker-seconds);
the others are marked ``thorough`` (their eager parity runs in CI, the compiled path lowers
them with the same impls, and the compiled model tests run it whole).
"""
from __future__ import annotations

import functools

import pytest
import torch

import families as F
import known
import test_parity as P
from tpu_kernels import compile_backend


class CompiledImpl:
    """The pseudo-impl "compile:tpu": calls the op through ``compiled_call``."""
    kind, name = "compile", "tpu"

    @staticmethod
    def caller(op):
        return compiled_call(op)


COMPILED = CompiledImpl()

# Ops whose result is a Python number or whose output shape depends on values: torch.compile
# graph-breaks on them by design (no graph to compile), so they cannot be cases here.
NOT_GRAPHABLE = {
    "aten._local_scalar_dense.default": "returns a Python scalar: .item() ends a graph",
    "aten.nonzero.default": "output shape depends on values (Dynamo graph-breaks)",
    "aten.unique_consecutive.default": "output shape depends on values",
    "aten._unique2.default": "output shape depends on values",
    "aten.masked_select.default": "output shape depends on values",
    "aten.unique_dim.default": "output shape depends on values",
    "aten.is_nonzero.default": "returns a Python bool",
    "aten.equal.default": "returns a Python bool",
    "aten.allclose.default": "returns a Python bool",
}


def _cases():
    ops = {p.values[0] for p in P.CASES}
    out = []
    for op in sorted(ops, key=str):
        if F.strategy(op) is None:
            continue
        marks = [pytest.mark.skip(reason=NOT_GRAPHABLE[str(op)])] if str(op) in NOT_GRAPHABLE else []
        key = f"{op}|compile:tpu"
        if F.tier(op) != 1 or not known.in_ci_sample("parity", key):
            marks.append(pytest.mark.thorough)
        out.append(pytest.param(op, id=key, marks=marks))
    return out


def _invoke(op, *args, **kwargs):
    return op(*args, **kwargs)


def compiled_call(op):
    """Call ``op`` as a freshly compiled one-op function; fail if nothing was compiled."""
    def call(*args, **kwargs):
        torch._dynamo.reset()
        start = len(compile_backend.PROGRAMS)
        fn = torch.compile(functools.partial(_invoke, op), backend="tpu", fullgraph=True, dynamic=False)
        out = fn(*args, **kwargs)
        if len(compile_backend.PROGRAMS) == start:
            raise AssertionError(f"{op}: torch.compile produced no tpu graph")
        return out
    return call


@pytest.mark.parametrize("op", _cases())
def test_compiled_parity(op, record_property):
    P.check_case(op, COMPILED, record_property)
