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
from tpu_kernels.dispatch.cache import CompiledCall, _default_dtype, _matmul_precision, mode_token
from tpu_kernels.dispatch.devices import made_on, named_index, same_device, where_inputs_are
from tpu_kernels.dispatch.meta import cpu_error
from tpu_kernels.dispatch.plan import SCALAR, SCALAR_LIST, SLOT, STATIC, TENSOR, TENSOR_LIST, op_plan
from tpu_kernels.dispatch.results import finish
from tpu_kernels.dispatch.signature import Split, leaf_value, split
from tpu_kernels.lazy import Lazy
from tpu_kernels.registry import REGISTRY, value_checks
from tpu_kernels.registry.context import INDEX_CHECKS
from tpu_kernels.registry.route import runtime_route
from tpu_kernels.fast_tokens import direct_token, fast_token
from tpu_kernels.tensor import TpuTensor, wrap_fast
from tpu_kernels.tensor_values import read
class _OpState:
    """What the hot path keeps per op: its runtime handler (or None) and its plan, as of
    one registry epoch; ``codes``: per position, what ``fast_key`` takes there (a tensor:
    ``_TENSOR``, a number that is a leaf: ``_LEAF``, a static argument: ``_STATIC``, a
    tensor list: ``_TENSORS``, a list of numbers: ``_NUMBERS``, anything else: 0)."""
    __slots__ = ("op", "epoch", "handler", "plan", "kinds", "codes", "check")

    def __init__(self, op: OpOverload) -> None:
        r = runtime_route(op)
        self.op, self.epoch = op, REGISTRY.epoch
        self.handler = r.impl.fn if r is not None else None
        self.plan = op_plan(op)
        self.kinds = self.plan.pos_kinds
        self.codes = tuple(_CODES.get(k, 0) for k in self.kinds)
        self.check = value_checks.checker(op)   # torch's checks of number values, or None


# per position: a tensor, a number that is a leaf, a static argument (an int list there is
# keyed by value: layer norm's normalized_shape, a reduction's dims), a tensor list and a
# list of numbers (the foreach ops': each element a leaf), anything else
_TENSOR, _LEAF, _STATIC, _TENSORS, _NUMBERS = 2, 1, -1, 3, 4
_CODES = {TENSOR: _TENSOR, SCALAR: _LEAF, STATIC: _STATIC, TENSOR_LIST: _TENSORS, SCALAR_LIST: _NUMBERS}
_VIEW = object()   # in a fast key: the view geometry of the tensor before it follows


_OPS: dict[int, _OpState] = {}   # id(op) -> its state (OpOverload hashes in Python: slow)


def _state(op: OpOverload) -> _OpState:
    s = _OPS.get(id(op))
    if s is None or s.op is not op or s.epoch != REGISTRY.epoch:
        s = _OPS[id(op)] = _OpState(op)
    return s


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
    if not kwargs or _plain_kwargs(kwargs):
        hit = cache.FAST.get(fast_key(s, args) if not kwargs else _with_kwargs(fast_key(s, args), kwargs))
        if hit is not None and hit[3] is cache.CALLS:   # seen before: straight to the executable
            compiled, pos, ckey, calls, single, folded = hit
            compiled.calls += 1
            calls.hits += 1
            if not compiled.calls & 63:   # keep it recently used in CALLS (approximately)
                calls.touch(ckey)
            dyn = _values(args, pos) if folded is None else _leaf_values(args, pos, folded)
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


def _plain_kwargs(kwargs: dict) -> bool:
    """True when every keyword argument is None or a number (SDPA's backward takes
    ``attn_mask=None, scale=...``): the FAST key can hold them by value."""
    for v in kwargs.values():
        t = type(v)
        if v is not None and t is not float and t is not int and t is not bool:
            return False
    return True


def _with_kwargs(key: tuple | None, kwargs: dict) -> tuple | None:
    """``fast_key`` of the positional arguments extended by plain keyword arguments' names,
    types and values (their order too: torch passes a schema's keywords in order)."""
    if key is None:
        return None
    return key + tuple((k, type(v), v) for k, v in kwargs.items())


def _record_one(op: OpOverload, compiled: CompiledCall, dyn: list, single: tuple) -> TpuTensor:
    """``execute`` and ``finish`` for a FAST hit with one result while deferred mode records."""
    spec = compiled.lazy_spec
    if spec is None:
        spec = compiled.lazy_spec = lazy.out_spec(compiled.fn, dyn)
    leaves = lazy.record_leaves(compiled.fn, dyn, spec[0])
    if len(leaves) > 1:      # (its result, then its check flags)
        errors.watch(leaves[1], op, compiled.fn.checks)
    return wrap_fast(leaves[0], *single)


def _values(args: tuple, pos: tuple) -> list:
    """The leaves at ``pos``: each tensor ``read`` (a whole-storage tensor's array without
    its three calls), numbers as they are."""
    out = []
    for i in pos:
        a = args[i]
        if type(a) is TpuTensor:
            if a._tpu_direct:
                a = a._tpu_storage.array
                if type(a) is Lazy and not _LAZY.depth:   # tensor._settle
                    a = lazy.concrete(a)
            else:
                a = read(a)
        out.append(a)
    return out


def _leaf_values(args: tuple, pos: tuple, folded: tuple) -> list:
    """The leaves at ``pos`` (an argument's position, or (position, index) of a list's
    element), each read as ``folded`` says (a view read by the program: its storage's array)."""
    out = []
    for p, f in zip(pos, folded):
        a = args[p] if type(p) is int else args[p[0]][p[1]]
        if not f and type(a) is TpuTensor and a._tpu_direct:   # ``_values``' common case
            a = a._tpu_storage.array
            if type(a) is Lazy and not _LAZY.depth:
                a = lazy.concrete(a)
            out.append(a)
        else:
            out.append(leaf_value(a, f or None))
    return out


def fast_key(s: _OpState, args: tuple) -> tuple | None:
    """The FAST key of a call of positional tpu tensors, numbers and static int lists: per
    argument, a tensor's geometry token (``fast_tokens.fast_token``: sizes, dtype, device index,
    a view's strides and offset) and for a view its storage array's shape and dtype, a
    number's type and (where ``split`` does not make it a leaf) value, a static int list's
    values, a tensor list's length and tensors, a number list's length and types, or
    None; the call is not indexed (None) for any other argument. Equal keys
    mean equal ``lookup`` keys (the op state stands for the registry epoch; ``split``
    freezes a static list into the tuple of its values)."""
    key = [s, _matmul_precision(), _default_dtype(), INDEX_CHECKS.on]
    for a, code in zip(args, s.codes):
        t = type(a)
        if t is TpuTensor:
            if code != _TENSOR:
                return None
            tok = a._tpu_fk
            key.append(fast_token(a) if tok is None else tok)
            if not a._tpu_direct:   # a view: its program may read it from the storage
                st = a._tpu_storage.array
                key += (_VIEW, st.shape, st.dtype)
        elif t is float or t is int or t is bool:
            key += (t, SLOT if 0 < code <= _TENSOR else a)
        elif a is None:
            key.append(None)
        elif t is list or t is tuple:
            if code == _STATIC:
                for x in a:   # (an int list, or a bool list: a backward's output mask)
                    if type(x) is not int and type(x) is not bool:
                        return None
                key += (tuple, tuple(a))
            elif code == _TENSORS:
                if not _key_tensors(key, a):
                    return None
            elif code == _NUMBERS:
                key += (list, len(a))
                for x in a:
                    tx = type(x)
                    if tx is not float and tx is not int and tx is not bool:
                        return None
                    key.append(tx)
            else:
                return None
        else:
            return None
    return tuple(key)


def _key_tensors(key: list, a: list) -> bool:
    """``fast_key``'s part for a tensor list (its length, then each tensor as alone);
    False when an element is not a tpu tensor."""
    key += (list, len(a))
    for x in a:
        if type(x) is not TpuTensor:
            return False
        tok = x._tpu_fk
        key.append(fast_token(x) if tok is None else tok)
        if not x._tpu_direct:
            st = x._tpu_storage.array
            key += (_VIEW, st.shape, st.dtype)
    return True


def _remember(op: OpOverload, compiled: CompiledCall, args: tuple, kwargs: dict, ckey: tuple,
              reads: list) -> None:
    """Index ``compiled`` in FAST under this call's fast key, when the hot path can run it:
    a jitted impl that draws no random key and whose keyword arguments are plain
    (``_plain_kwargs``), none of them a leaf. The leaves are the arguments at ``pos`` in
    order (a list's elements at (position, index)); ``folded`` says which are views whose
    program reads them from their storage's array (None when none is and no leaf is a
    list's). An impl that reads some scalars' values (``static``) has them keyed by value."""
    impl = compiled.impl
    if impl.random or impl.data_dependent:
        return
    s = _state(op)
    for k, v in kwargs.items():    # a keyword argument that is a leaf: left to the slow path
        kind = s.plan.kw_kinds.get(k, STATIC)
        if v is not None and (kind == TENSOR or kind == SCALAR and k not in impl.static):
            return
    static = _static_positions(s, impl.static)
    key = fast_key(s, args) if not kwargs else _with_kwargs(fast_key(s, args), kwargs)
    if key is None:
        return
    pos: list = []
    for i, (a, k) in enumerate(zip(args, s.kinds)):
        if a is not None and (k == TENSOR or k == SCALAR and i not in static):
            pos.append(i)
        elif a is not None and k in (TENSOR_LIST, SCALAR_LIST):
            pos += [(i, j) for j in range(len(a))]
    if len(pos) != len(reads):   # not the leaves ``split`` found: leave it to the slow path
        return
    lists = any(type(p) is tuple for p in pos)
    folded = tuple(r is not None for r in reads) if lists or any(r is not None for r in reads) else None
    cache.FAST[key] = (compiled, tuple(pos), ckey, cache.CALLS, _result_geometry(compiled, args), folded)


def _static_positions(s: _OpState, static: tuple[str, ...]) -> tuple[int, ...]:
    """The positions of the scalars an impl reads by value (``Impl.static``); from now on
    the op's fast keys hold their values (``_STATIC``), not their types."""
    if not static:
        return ()
    names = s.plan.names
    found = tuple(i for i, k in enumerate(s.kinds) if k == SCALAR and names[i] in static)
    if any(s.codes[i] != _STATIC for i in found):
        s.codes = tuple(_STATIC if i in found else c for i, c in enumerate(s.codes))
    return found


def _result_geometry(compiled: CompiledCall, args: tuple) -> tuple | None:
    """What ``wrap_fast`` makes a FAST hit's one result with: (sizes, dtype, bytes, device
    index, geometry token); None unless the op returns one plain tensor. A FAST hit has the
    devices of its first call (the key holds them), which ``same_device`` checked: the
    result is on the first tensor's device."""
    if compiled.single_out is None:
        return None
    size, _, dtype, nbytes = compiled.single_out
    first = next(a if type(a) is TpuTensor else a[0] for a in args
                 if type(a) is TpuTensor or (type(a) in (list, tuple) and a and type(a[0]) is TpuTensor))
    index = first._tpu_storage.index
    return size, dtype, nbytes, index, direct_token(size, dtype, index)


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
    if devices.several:   # JAX would move an operand on another tpu device: torch raises
        same_device(op, sp.leaves, (args, kwargs))
        named = named_index(kwargs)
        if named is not None and compiled.torch_fn is None:   # zeros_like(t, device="tpu:1")
            compiled.calls += 1
            return made_on(named, lambda: finish(compiled, args, kwargs, execute(
                op, compiled, leaves(compiled, sp, kwargs), args, kwargs)))
    compiled.calls += 1
    if compiled.torch_fn is not None:  # decomposition or CPU fallback: runs in torch land
        return compiled.torch_fn(op, args, kwargs)
    if not kwargs or _plain_kwargs(kwargs):
        _remember(op, compiled, args, kwargs, ckey, sp.reads)
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
        values = [lazy.concrete(d) for d in dyn]
        return where_inputs_are(compiled.fn, values) if devices.several else compiled.fn(*values)
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
