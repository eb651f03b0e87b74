"""The eager hot path's index (``cache.FAST``): per op its state, per call a key that
stands for its ``lookup`` key, and what a hit reads as its executable's inputs.

A call is indexed (``remember``) after its first run through ``run_call`` when its
executable can be called straight from its arguments: a jitted impl that draws no random
key, no tensor among its keyword arguments. The key (``fast_key``, ``with_kwargs``) holds
per argument what ``split`` would make of it: a tensor's geometry token, a leaf number's
type (its value is an input of the executable), a static argument's value; keyword
numbers likewise (the fused optimizers' ``lr=``, ``beta1=``..., ``_foreach_add_``'s
``alpha=``: leaves, keyed by type, so a changing learning rate still hits).
"""
from __future__ import annotations

from torch._ops import OpOverload

from tpu_kernels import lazy
from tpu_kernels.dispatch import cache
from tpu_kernels.dispatch.cache import CompiledCall, _default_dtype, _matmul_precision
from tpu_kernels.dispatch.plan import SCALAR, SCALAR_LIST, SLOT, STATIC, TENSOR, TENSOR_LIST, op_plan
from tpu_kernels.dispatch.signature import leaf_value
from tpu_kernels.fast_tokens import direct_token, fast_token
from tpu_kernels.lazy import Lazy
from tpu_kernels.registry import REGISTRY, value_checks
from tpu_kernels.registry.context import INDEX_CHECKS
from tpu_kernels.registry.route import runtime_route
from tpu_kernels.tensor import TpuTensor
from tpu_kernels.tensor_values import read

_LAZY = lazy._STATE           # ``.depth``: lazy.recording() without its call


class _OpState:
    """What the hot path keeps per op: its runtime handler (or None) and its plan, as of
    one registry epoch; ``codes``: per position, what ``fast_key`` takes there (a tensor:
    ``_TENSOR``, a number that is a leaf: ``_LEAF``, a static argument: ``_STATIC``, a
    tensor list: ``_TENSORS``, a list of numbers: ``_NUMBERS``, anything else: 0);
    ``kw_codes``: per keyword name, ``_LEAF`` for a number keyword (keyed by type), any
    other keyword is keyed by value."""
    __slots__ = ("op", "epoch", "handler", "plan", "kinds", "codes", "kw_codes", "check")

    def __init__(self, op: OpOverload) -> None:
        r = runtime_route(op)
        self.op, self.epoch = op, REGISTRY.epoch
        self.handler = r.impl.fn if r is not None else None
        self.plan = op_plan(op)
        self.kinds = self.plan.pos_kinds
        self.codes = tuple(_CODES.get(k, 0) for k in self.kinds)
        self.kw_codes = {k: _LEAF for k, kind in self.plan.kw_kinds.items() if kind == SCALAR}
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


def plain_kwargs(kwargs: dict) -> bool:
    """True when every keyword argument is None or a number (SDPA's backward takes
    ``attn_mask=None, scale=...``): the FAST key can hold them by value."""
    for v in kwargs.values():
        t = type(v)
        if v is not None and t is not float and t is not int and t is not bool:
            return False
    return True


def with_kwargs(s: _OpState, key: tuple | None, kwargs: dict) -> tuple | None:
    """``fast_key`` of the positional arguments extended by plain keyword arguments' names,
    types and values, a leaf number's type only (their order too: torch passes a schema's
    keywords in order)."""
    if key is None:
        return None
    codes = s.kw_codes
    return key + tuple((k, type(v), SLOT if v is not None and codes.get(k) == _LEAF else v)
                       for k, v in kwargs.items())


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


def leaf_values(args: tuple, kwargs: dict, pos: tuple, folded: tuple) -> list:
    """The leaves at ``pos`` (an argument's position, (position, index) of a list's
    element, or a keyword's name), each read as ``folded`` says (a view read by the
    program: its storage's array)."""
    out = []
    for p, f in zip(pos, folded):
        t = type(p)
        a = args[p] if t is int else kwargs[p] if t is str else args[p[0]][p[1]]
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


def remember(op: OpOverload, compiled: CompiledCall, args: tuple, kwargs: dict, ckey: tuple,
             reads: list) -> None:
    """Index ``compiled`` in FAST under this call's fast key, when the hot path can run it:
    a jitted impl that draws no random key and whose keyword arguments are plain
    (``plain_kwargs``), no tensor among them. The leaves are the arguments at ``pos`` in
    order (a list's elements at (position, index), then the leaf keywords by name);
    ``folded`` says which are views whose program reads them from their storage's array
    (None when none is and every leaf is a positional argument). An impl that reads some
    scalars' values (``static``) has them keyed by value."""
    impl = compiled.impl
    if impl.random or impl.data_dependent:
        return
    s = _state(op)
    for k, v in kwargs.items():    # a tensor keyword argument: left to the slow path
        if v is not None and s.plan.kw_kinds.get(k, STATIC) == TENSOR:
            return
    static = _static_positions(s, impl.static)
    key = fast_key(s, args) if not kwargs else with_kwargs(s, fast_key(s, args), kwargs)
    if key is None:
        return
    pos: list = []
    for i, (a, k) in enumerate(zip(args, s.kinds)):
        if a is not None and (k == TENSOR or k == SCALAR and i not in static):
            pos.append(i)
        elif a is not None and k in (TENSOR_LIST, SCALAR_LIST):
            pos += [(i, j) for j in range(len(a))]
    pos += [k for k, v in kwargs.items() if v is not None and s.kw_codes.get(k) == _LEAF]
    if len(pos) != len(reads):   # not the leaves ``split`` found: leave it to the slow path
        return
    lists = any(type(p) is not int for p in pos)
    folded = tuple(r is not None for r in reads) if lists or any(r is not None for r in reads) else None
    cache.FAST[key] = (compiled, tuple(pos), ckey, cache.CALLS, _result_geometry(compiled, args), folded)


def _static_positions(s: _OpState, static: tuple[str, ...]) -> tuple[int, ...]:
    """The positions of the scalars an impl reads by value (``Impl.static``); from now on
    the op's fast keys hold their values (``_STATIC``), not their types (keywords too)."""
    if not static:
        return ()
    if any(s.kw_codes.get(k) == _LEAF for k in static):
        s.kw_codes = {k: c for k, c in s.kw_codes.items() if k not in static}
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
