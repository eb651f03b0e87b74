"""The hot path: an ATen call on tpu tensors -> its route -> a cached jitted call -> tensors.

``run`` is what every tpu tensor's ``__torch_dispatch__`` calls, the single seam where an
op is executed or (in deferred mode) recorded. An op a runtime handler takes goes to the
handler. Every other call is split into a signature and its leaves; the first call with
a signature builds a ``CompiledCall`` (``build.py``); every later call only unwraps,
calls, and wraps.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch._ops import OpOverload

from tpu_kernels import devices, errors, inflight, lazy, random_state
from tpu_kernels.dispatch import cache, graph_trace
from tpu_kernels.dispatch.build import build
from tpu_kernels.dispatch.devices import same_device
from tpu_kernels.dispatch.cache import CompiledCall, mode_token
from tpu_kernels.dispatch.meta import cpu_error
from tpu_kernels.dispatch.plan import op_plan
from tpu_kernels.dispatch.results import finish
from tpu_kernels.dispatch.signature import Split, leaf_value, split
from tpu_kernels.registry import REGISTRY
from tpu_kernels.registry.route import runtime_route

_HANDLERS: dict[Any, tuple[int, Callable | None]] = {}   # op -> (registry epoch, its runtime handler)


def _handler(op: OpOverload) -> Callable | None:
    hit = _HANDLERS.get(op)
    if hit is not None and hit[0] == REGISTRY.epoch:
        return hit[1]
    r = runtime_route(op)
    fn = r.impl.fn if r is not None else None
    _HANDLERS[op] = (REGISTRY.epoch, fn)
    return fn


def run(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """Execute ``op`` on tpu tensors (the ``__torch_dispatch__`` of every tpu tensor)."""
    if errors.pending() and not errors.on_worker_thread():
        errors.raise_pending()
    handler = _handler(op)
    if handler is not None:
        return handler(op, args, kwargs)
    return run_call(op, args, kwargs)


def _torch_error(op: OpOverload, args: tuple, kwargs: dict, exc: Exception) -> Exception:
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
    compiled, sp = lookup(op, args, kwargs)
    if devices.several:   # JAX would move an operand on another tpu device: torch raises
        same_device(op, sp.leaves, (args, kwargs))
    compiled.calls += 1
    if compiled.torch_fn is not None:  # decomposition or CPU fallback: runs in torch land
        return compiled.torch_fn(op, args, kwargs)
    return finish(compiled, args, kwargs, execute(op, compiled, leaves(compiled, sp, kwargs), args, kwargs))


def lookup(op: OpOverload, args: tuple, kwargs: dict) -> tuple[CompiledCall, Split]:
    """The call's ``CompiledCall`` (built on its signature's first call) and its split."""
    plan = op_plan(op)
    sp, targs, tkw = split(plan, args, kwargs)
    key = (op, targs, tkw, tuple(sp.sig), mode_token())
    calls = cache.CALLS
    compiled = calls.get(key)
    if compiled is None:
        compiled = calls.put(key, build(plan, args, kwargs, targs, tkw))
    if compiled.impl.static:  # this impl needs some scalars' values: key on them too
        sp, targs, tkw = split(plan, args, kwargs, compiled.impl.static)
        key = (key, targs, tkw)
        compiled = calls.get(key) or calls.put(key, build(plan, args, kwargs, targs, tkw))
    return compiled, sp


def leaves(compiled: CompiledCall, sp: Split, kwargs: dict) -> list:
    """The values the executable takes: each input read, and a PRNG key for a random impl."""
    dyn = [leaf_value(v) for v in sp.leaves]
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
        out, flags = lazy.record(compiled.fn, *dyn) if lazy.recording() else inflight.track(compiled.fn(*dyn))
    except Exception as exc:
        err = _torch_error(op, args, kwargs, exc)
        if err is exc:
            raise
        raise err from exc
    if flags is not None:
        trace = graph_trace.active()
        if trace is not None:   # traced: the flags become outputs of the compiled graph
            trace.add_checks(flags, str(op), compiled.fn.checks)
        else:
            errors.watch(flags, str(op), compiled.fn.checks)
    return out
