"""The hot path: an ATen call on tpu tensors -> its route -> a cached jitted call -> tensors.

``run`` is what every tpu tensor's ``__torch_dispatch__`` calls, the single seam where an
op is executed or (in deferred mode) recorded. An op a runtime handler takes goes to the
handler. Every other call is split into a signature and its leaves; the first call with
a signature builds a ``CompiledCall`` (``build.py``); every later call only unwraps,
calls, and wraps.
"""
from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload

from tpu_kernels import devices, errors, inflight, lazy, random_state
from tpu_kernels.dispatch import cache, graph_trace
from tpu_kernels.dispatch.build import build
from tpu_kernels.dispatch.cache import CompiledCall, mode_token
from tpu_kernels.dispatch.devices import made_on, named_index, same_device
# (``_state``, ``_values``, ``fast_key``: also read by tests and bench/dispatch_stages.py)
from tpu_kernels.dispatch.fast_index import (_OPS, _state, _values, fast_key, leaf_values, plain_kwargs,
                                             remember, with_kwargs)
from tpu_kernels.dispatch.meta import cpu_error
from tpu_kernels.dispatch.plan import op_plan
from tpu_kernels.dispatch.results import finish
from tpu_kernels.dispatch.signature import Split, leaf_value, split
from tpu_kernels.registry import REGISTRY
from tpu_kernels.tensor import TpuTensor, wrap_fast


def run(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """Execute ``op`` on tpu tensors (the ``__torch_dispatch__`` of every tpu tensor)."""
    if errors.pending() and not errors.in_backward():
        errors.raise_pending()
    s = _OPS.get(id(op))
    if s is None or s.op is not op or s.epoch != REGISTRY.epoch:
        s = _state(op)
    if s.check is not None:   # every call: the caches below key numbers by type, not value
        s.check(args, kwargs)
    if s.handler is not None:
        return s.handler(op, args, kwargs)
    if not kwargs or plain_kwargs(kwargs):
        hit = cache.FAST.get(fast_key(s, args) if not kwargs else with_kwargs(s, fast_key(s, args), kwargs))
        if hit is not None and hit[3] is cache.CALLS:   # seen before: straight to the executable
            compiled, pos, ckey, calls, single, folded = hit
            compiled.calls += 1
            calls.hits += 1
            if not compiled.calls & 63:   # keep it recently used in CALLS (approximately)
                calls.touch(ckey)
            dyn = _values(args, pos) if folded is None else leaf_values(args, kwargs, pos, folded)
            if single is None or _TRACE.trace is not None or inflight._on or kwargs:
                return finish(compiled, args, kwargs, execute(op, compiled, dyn, args, kwargs))
            if _LAZY.depth:
                if not _LAZY.paused:   # deferred mode: recorded, its one result wrapped as it is
                    return _record_one(op, compiled, dyn, single)
                return finish(compiled, args, {}, execute(op, compiled, dyn, args, {}))
            # plain eager, one result: ``execute`` and ``finish`` inlined (each frame counts here)
            try:
                out, flags = compiled.call(*dyn)
            except Exception as exc:
                out, flags = _call_failed(op, compiled, dyn, args, exc)
            if flags is not None:
                errors.watch(flags, op, compiled.fn.checks)
            return wrap_fast(out[0], *single)
    return run_call(op, args, kwargs)


_TRACE = graph_trace._local   # ``.trace``: graph_trace.active() without its call
_LAZY = lazy._STATE           # ``.depth``: lazy.recording() without its call


def _record_one(op: OpOverload, compiled: CompiledCall, dyn: list, single: tuple) -> TpuTensor:
    """``execute`` and ``finish`` for a FAST hit with one result while deferred mode records."""
    spec = compiled.lazy_spec
    if spec is None:
        spec = compiled.lazy_spec = lazy.out_spec(compiled.fn, dyn)
    leaves = lazy.record_leaves(compiled.fn, dyn, spec[0])
    if len(leaves) > 1:      # (its result, then its check flags)
        errors.watch(leaves[1], op, compiled.fn.checks)
    return wrap_fast(leaves[0], *single)


def _call_failed(op: OpOverload, compiled: CompiledCall, dyn: list, args: tuple, exc: Exception) -> tuple:
    """The hot path's call of ``compiled.call`` raised ``exc``: a TypeError of the settled
    executable (arrays of another weak type) goes to ``compiled.fn``'s own paths; any other
    error is raised in torch's words (``_translated``)."""
    if isinstance(exc, TypeError) and compiled.call is not compiled.fn:
        try:
            return compiled.fn(*dyn)
        except Exception as again:  # noqa: BLE001 - raised below, translated
            exc = again
    err = _translated(op, args, {}, exc)
    if err is exc:
        raise exc
    raise err from exc


def _translated(op: OpOverload, args: tuple, kwargs: dict, exc: Exception) -> Exception:
    """What a failed call raises, in torch's words: out of memory as torch's
    ``OutOfMemoryError``; arguments an impl refused while tracing (a check torch's meta
    function does not make) with torch's CPU kernel's error for the same call."""
    if "RESOURCE_EXHAUSTED" in str(exc):  # XLA could not allocate
        return torch.OutOfMemoryError(f"{op}: out of memory on the tpu device: {exc}")
    if isinstance(exc, (RuntimeError, ValueError, IndexError)):
        return cpu_error(op, args, kwargs) or exc
    return exc


def run_call(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """Run one call through its signature's ``CompiledCall`` (the route after runtime
    handlers: a registered impl, a twin, a decomposition, the CPU fallback, or the
    refusal). A runtime handler hands calls it does not take itself on to here."""
    compiled, sp, ckey = lookup(op, args, kwargs)
    compiled.calls += 1
    if devices.several:   # JAX would move an operand on another tpu device: torch raises
        inputs = same_device(op, sp.leaves, (args, kwargs))
        # made where ``device=`` says (zeros_like(t, device="tpu:1")); an unjitted impl
        # (nonzero: built from host values) where its inputs are
        where = named_index(kwargs)
        if where is None and compiled.impl.data_dependent:
            where = inputs
        if where is not None and compiled.torch_fn is None:
            return made_on(where, lambda: finish(compiled, args, kwargs, execute(
                op, compiled, leaves(compiled, sp, kwargs), args, kwargs)))
    if compiled.torch_fn is not None:  # decomposition or CPU fallback: runs in torch land
        return compiled.torch_fn(op, args, kwargs)
    if not kwargs or plain_kwargs(kwargs):
        remember(op, compiled, args, kwargs, ckey, sp.reads)
    return finish(compiled, args, kwargs, execute(op, compiled, leaves(compiled, sp, kwargs), args, kwargs))


def lookup(op: OpOverload, args: tuple, kwargs: dict) -> tuple[CompiledCall, Split, tuple]:
    """The call's ``CompiledCall`` (built on its signature's first call), its split, and
    its key in ``cache.CALLS``."""
    plan = op_plan(op)
    sp, targs, tkw = split(plan, args, kwargs)
    key = (plan, targs, tkw, tuple(sp.sig), mode_token())
    calls = cache.CALLS
    compiled = calls.get(key)
    if compiled is None:
        compiled = calls.put(key, build(plan, args, kwargs, targs, tkw, tuple(sp.reads)))
    if compiled.impl.static:  # this impl needs some scalars' values: key on them too
        sp, targs, tkw = split(plan, args, kwargs, compiled.impl.static)
        key = (key, targs, tkw)
        compiled = calls.get(key) or calls.put(key, build(plan, args, kwargs, targs, tkw, tuple(sp.reads)))
    return compiled, sp, key


def leaves(compiled: CompiledCall, sp: Split, kwargs: dict) -> list:
    """The values the executable takes: each input read, and a PRNG key for a random impl."""
    dyn = [leaf_value(v, r) for v, r in zip(sp.leaves, sp.reads)]
    if compiled.impl.random:
        trace = graph_trace.active()
        dyn.append(trace.next_key_data() if trace is not None else random_state.reserve(1, kwargs.get("generator")))
    return dyn


def execute(op: OpOverload, compiled: CompiledCall, dyn: list, args: tuple, kwargs: dict) -> Any:
    """Run (or, while deferred mode records, record) the executable; its check flags are
    watched. Returns the impl's outputs."""
    if compiled.impl.data_dependent:  # its result shape needs values: run what is pending
        return compiled.fn(*[lazy.concrete(d) for d in dyn])
    try:
        if lazy.recording():   # the output structure is the signature's: worked out once
            spec = compiled.lazy_spec
            if spec is None:
                spec = compiled.lazy_spec = lazy.out_spec(compiled.fn, dyn)
            out, flags = lazy.record(compiled.fn, *dyn, spec=spec)
        else:
            out, flags = inflight.track(compiled.fn(*dyn))
    except Exception as exc:
        err = _translated(op, args, kwargs, exc)
        if err is exc:
            raise
        raise err from exc
    if flags is not None:
        trace = graph_trace.active()
        if trace is not None:   # traced: the flags become outputs of the compiled graph
            trace.add_checks(flags, str(op), compiled.fn.checks)
        else:
            errors.watch(flags, op, compiled.fn.checks)
    return out


# Dynamo must never trace the runtime itself (it would trace into JAX), so under
# torch.compile each tpu op runs here eagerly, as a graph break: the tensor's hook and the
# factory kernels call this guarded entry while Dynamo compiles or a compiled function
# runs (its graph breaks' eager code), and ``run`` itself otherwise (no frame callback is
# set: the guard's cost, about 1 us a call, is skipped). torch._disable_dynamo is torch's
# own lazy torch._dynamo.disable: Dynamo is imported at the first guarded call (when
# torch.compile has loaded it anyway), not with this package.
guarded_run = torch._disable_dynamo(run, recursive=True)
