"""The hot path: an ATen call on tpu tensors -> registry impl -> cached jax.jit -> tensors.

``run`` is the single seam where an op is executed. The first call with a given
argument signature (op, static arguments, tensor shapes and dtypes) runs torch's meta
function for the result's metadata (and torch's own error for bad arguments), resolves
the impl, and builds a jitted function; every later call with that signature only
unwraps, calls, and wraps.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import warnings
from typing import Any, Callable

import jax
import torch
from torch._ops import OpOverload

from tpu_kernels import deferred_mode as deferred, errors, random_state
from tpu_kernels.deferred_mode import force
from tpu_kernels.lru import LRU
from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry import REGISTRY, Impl
from tpu_kernels.registry.context import Call, OutMeta, lowering
from tpu_kernels.registry.dtypes import to_jax_dtype, to_torch_dtype
from tpu_kernels.tensor import TpuTensor, read, to_jax, to_torch, value, wrap, wrap_result, write

log = logging.getLogger("tpu_kernels.dispatch")
aten = torch.ops.aten

# schema argument kinds
TENSOR, TENSOR_LIST, SCALAR, SCALAR_LIST, STATIC = "tensor", "tensor_list", "scalar", "scalar_list", "static"
_SCALAR_TYPES = {"number", "Optional[number]", "float", "Optional[float]"}


class _Slot:
    """Marks where a dynamic argument sits in a call's static template."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "<slot>"


SLOT = _Slot()


# -- per-op schema analysis --------------------------------------------------------
@dataclasses.dataclass
class OpPlan:
    op: OpOverload
    pos_kinds: list[str]
    kw_kinds: dict[str, str]
    mutated: list[int]            # schema positions of args written in place
    names: list[str]
    alias_returns: list[int | None]   # for each return: the arg position it aliases
    is_view: bool


_PLANS: dict[Any, OpPlan] = {}


def op_plan(op: OpOverload) -> OpPlan:
    plan = _PLANS.get(op)
    if plan is None:
        plan = _PLANS[op] = _make_plan(op)
    return plan


def _arg_kind(arg) -> str:
    t = str(arg.type)
    if t in ("Tensor", "Optional[Tensor]"):
        return TENSOR
    if t in ("List[Tensor]", "List[Optional[Tensor]]", "Optional[List[Tensor]]"):
        return TENSOR_LIST
    if t in _SCALAR_TYPES:
        return SCALAR
    if t == "List[number]":  # Scalar[]: optimizers pass new values every step
        return SCALAR_LIST
    return STATIC


def _make_plan(op: OpOverload) -> OpPlan:
    schema = op._schema
    args = schema.arguments
    kinds = [_arg_kind(a) for a in args]
    mutated = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    alias_returns: list[int | None] = []
    for r in schema.returns:
        hit = None
        if r.alias_info is not None:
            for i, a in enumerate(args):
                if a.alias_info is not None and set(a.alias_info.before_set) & set(r.alias_info.before_set):
                    hit = i
                    break
        alias_returns.append(hit)
    return OpPlan(op, kinds, {a.name: k for a, k in zip(args, kinds)}, mutated,
                  [a.name for a in args], alias_returns, bool(op.is_view))


# -- signatures ------------------------------------------------------------------------
def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, torch.Tensor):  # a tensor in a non-tensor slot (rare): key by identity
        return ("tensor", id(v))
    return v


def _device_error(op, t: torch.Tensor) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"tpu:0 and {t.device}! (when checking arguments for {op})")


class _Split:
    """A call split into a hashable template and its dynamic leaves."""
    __slots__ = ("leaves", "sig", "op", "static_scalars")

    def __init__(self, op, static_scalars):
        self.leaves: list[Any] = []
        self.sig: list[Any] = []
        self.op = op
        self.static_scalars = static_scalars

    def conv(self, kind: str, name: str, v: Any) -> Any:
        if kind == TENSOR:
            if v is None:
                return None
            if isinstance(v, TpuTensor):
                self.leaves.append(v)
                self.sig.append((v.shape, v.dtype))
                return SLOT
            if isinstance(v, torch.Tensor):
                # CPU scalar tensors mix like in torch; foreach ops take a CPU `scalars` list
                if v.device.type != "cpu" or (v.dim() != 0 and name != "scalars"):
                    raise _device_error(self.op, v)
                self.leaves.append(v)  # a CPU scalar tensor mixes like in torch
                self.sig.append(("cpu", v.shape, v.dtype))
                return SLOT
            if type(v) in (int, float, bool):  # a wrapped number in a Tensor slot (x / 2.0)
                self.leaves.append(v)
                self.sig.append(type(v))
                return SLOT
            return _freeze(v)
        if kind == TENSOR_LIST:
            return None if v is None else tuple(self.conv(TENSOR, name, x) for x in v)
        if kind == SCALAR_LIST and isinstance(v, (list, tuple)):
            return tuple(self.conv(SCALAR, name, x) for x in v)
        if kind == SCALAR and type(v) in (int, float, bool) and name not in self.static_scalars:
            self.leaves.append(v)
            self.sig.append(type(v))
            return SLOT
        return _freeze(v)


def _split(plan: OpPlan, args: tuple, kwargs: dict, static_scalars: tuple[str, ...] = ()) -> tuple[_Split, tuple, tuple]:
    s = _Split(plan.op, static_scalars)
    kinds, names = plan.pos_kinds, plan.names
    targs = tuple(s.conv(kinds[i], names[i], a) for i, a in enumerate(args))
    tkw = tuple((k, s.conv(plan.kw_kinds.get(k, STATIC), k, v)) for k, v in kwargs.items())
    return s, targs, tkw


def _fill(template: Any, it) -> Any:
    if template is SLOT:
        return next(it)
    if type(template) is tuple:
        return tuple(_fill(x, it) for x in template)
    return template


def _leaf_value(v: Any) -> Any:
    if isinstance(v, TpuTensor):
        return read(v)
    if isinstance(v, torch.Tensor):
        return to_jax(v)
    return v


# -- meta --------------------------------------------------------------------------------
def _to_meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        if isinstance(v, TpuTensor):
            base = torch.empty(v._tpu_storage.numel, dtype=v.dtype, device="meta")
            return base.as_strided(v.shape, v.stride(), v.storage_offset())
        return v  # CPU scalar tensors (and foreach `scalars`) stay on the CPU, as torch wants
    if isinstance(v, (list, tuple)):
        return type(v)(_to_meta(x) for x in v)
    if isinstance(v, torch.device) and v.type == "tpu":
        return torch.device("meta")
    return v


def meta_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return tuple(_to_meta(a) for a in args), {k: _to_meta(v) for k, v in kwargs.items()}


def _out_metas(out: Any) -> list[OutMeta | None]:
    flat: list[OutMeta | None] = []

    def visit(x):
        if isinstance(x, torch.Tensor):
            flat.append(OutMeta(tuple(x.shape), x.dtype))
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y)
        else:
            flat.append(None)
    visit(out)
    return flat


# -- cache entries -------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class Entry:
    impl: Impl
    fn: Callable[..., Any]      # jitted (or eager, for data-dependent impls)
    plan: OpPlan
    result_meta: Any            # torch meta result (structure of the returns)
    write_dtypes: list          # for mutated args: torch dtype to write, per leaf
    calls: int = 0
    torch_fn: Callable[..., Any] | None = None   # decomposition / CPU fallback (torch land)


_RETIRED: dict[tuple[str, str], int] = {}   # calls of evicted entries, for op_counts


def _retire(key: Any, entry: "Entry") -> None:
    k = (str(entry.plan.op), entry.impl.kind)
    _RETIRED[k] = _RETIRED.get(k, 0) + entry.calls


_CACHE = LRU(on_evict=_retire)   # call signature -> Entry (a compiled executable): bounded
_VIEW_CACHE = LRU()   # view signature -> torch's meta result
TRACES: dict[Any, int] = {}   # op -> number of times an impl was traced for it


def _mode_token() -> tuple:
    # the chip kernels compile for (tpu_kernels.aot) changes which impl runs and its blocks
    return (REGISTRY.epoch, torch.get_float32_matmul_precision(), errors.INDEX_CHECKS,
            tpu_info.pinned())


def run(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """Execute ``op`` on tpu tensors (the ``__torch_dispatch__`` of every tpu tensor)."""
    if errors.pending() and not errors.on_worker_thread():
        errors.raise_pending()
    special = _SPECIAL.get(op)
    if special is not None:
        return special(op, args, kwargs)
    plan = op_plan(op)
    if plan.is_view:
        return _run_view(plan, args, kwargs)
    return _run_registered(op, args, kwargs)


def _run_registered(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    plan = op_plan(op)
    split, targs, tkw = _split(plan, args, kwargs)
    key = (op, targs, tkw, tuple(split.sig), _mode_token())
    entry = _CACHE.get(key)
    if entry is None:
        entry = _cache(key, _build(plan, args, kwargs, targs, tkw))
    if entry.impl.static:  # this impl needs some scalars' values: key on them too
        split, targs, tkw = _split(plan, args, kwargs, entry.impl.static)
        key = (key, targs, tkw)
        entry = _CACHE.get(key) or _cache(key, _build(plan, args, kwargs, targs, tkw))
    entry.calls += 1
    if entry.torch_fn is not None:  # decomposition or CPU fallback: runs in torch land
        return entry.torch_fn(op, args, kwargs)
    dyn = [_leaf_value(v) for v in split.leaves]
    if entry.impl.random:
        dyn.append(random_state.next_key_data())
    if entry.impl.data_dependent:  # its result shape needs values: run what is pending
        return _finish(entry, args, kwargs, split, entry.fn(*[force(d) for d in dyn]))
    try:
        out, flags = deferred.call(entry.fn, *dyn) if deferred.recording() else entry.fn(*dyn)
    except Exception as exc:  # XLA could not allocate: say so the way torch does
        if "RESOURCE_EXHAUSTED" not in str(exc):
            raise
        raise torch.OutOfMemoryError(f"{op}: out of memory on the tpu device: {exc}") from exc
    if flags is not None:
        errors.watch(flags, str(op), entry.fn.checks)
    return _finish(entry, args, kwargs, split, out)


def _cache(key: Any, entry: Entry) -> Entry:
    return _CACHE.put(key, entry)


def _build(plan, args, kwargs, targs, tkw) -> Entry:
    op = plan.op
    margs, mkwargs = meta_args(args, kwargs)
    impl, skipped = REGISTRY.resolve(op, margs, mkwargs)
    derived_from = None
    if impl is None and plan.mutated:
        impl, derived_from = _derive_inplace(op, margs, mkwargs)
    if impl is None:
        kind, torch_fn = _fallback(op, skipped)
        return Entry(Impl(op, torch_fn, kind, kind), None, plan, None, [], torch_fn=torch_fn)
    if impl.data_dependent:
        return Entry(impl, _eager_fn(impl, targs, tkw), plan, None, [])
    result_meta = _meta_result(op, impl, margs, mkwargs, targs, tkw, args, kwargs)
    outs = _out_metas(result_meta)
    _guard_memory(op, outs)
    if derived_from is not None:
        fmargs, fmkwargs = meta_args(args, kwargs)
        func_outs = _out_metas(derived_from(*fmargs, **fmkwargs))
    else:
        func_outs = outs
    _check_inplace_cast(op, plan, args, kwargs)
    write_dtypes = [_mutated_dtype(args, kwargs, plan, i) for i in plan.mutated]
    fn = _jit_fn(op, impl, targs, tkw, func_outs, outs, plan, write_dtypes)
    log.debug("%s -> %s (skipped: %s)", op, impl, [(i.name, r) for i, r in skipped])
    return Entry(impl, fn, plan, result_meta, write_dtypes)


GUARD_MIN_BYTES = 1 << 26   # results smaller than this are never checked against free memory


def _available_bytes() -> int | None:
    """Free memory where results live: host RAM for JAX's CPU backend, else the device's."""
    dev = jax.devices()[0]
    if dev.platform == "cpu":
        import psutil
        return psutil.virtual_memory().available
    stats = dev.memory_stats() or {}
    if "bytes_limit" in stats:
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    return None


def _guard_memory(op, outs) -> None:
    """Refuse, before compiling, a result that cannot fit: torch's OutOfMemoryError naming
    the op and the size, instead of XLA trying (and the host swapping or being killed)."""
    sizes = [(m, math.prod(m.shape) * m.dtype.itemsize) for m in outs if m is not None]
    need = sum(n for _, n in sizes)
    if need < GUARD_MIN_BYTES:
        return
    free = _available_bytes()
    if free is not None and need > free:
        shapes = ", ".join(f"{list(m.shape)} {m.dtype}" for m, _ in sizes)
        raise torch.OutOfMemoryError(
            f"{op}: tpu out of memory: tried to allocate {_gib(need)} ({shapes}) with "
            f"{_gib(free)} free")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _meta_result(op, impl: Impl, margs, mkwargs, targs, tkw, args, kwargs) -> Any:
    """torch's meta result (shapes, dtypes, and torch's own error for bad arguments).

    An op with no meta kernel takes its result's metadata from the impl, traced
    abstractly; an impl that needs torch's metadata to trace cannot run such an op.
    """
    try:
        return op(*margs, **mkwargs)
    except (NotImplementedError, AttributeError, TypeError) as exc:
        # no meta kernel, or a meta kernel that breaks on valid input (e.g. reading the
        # device of a None bias): take the metadata from the impl instead
        if isinstance(exc, NotImplementedError) and "Meta" not in str(exc):
            raise
        dyn = [jax.ShapeDtypeStruct(tuple(v.shape), to_jax_dtype(v.dtype)) if isinstance(v, torch.Tensor)
               else v for v in _split(op_plan(op), args, kwargs, impl.static)[0].leaves]

        def abstract(*leaves):
            it = iter(leaves)
            with lowering(Call((), None)):
                return impl.fn(*_fill(targs, it), **dict((k, _fill(v, it)) for k, v in tkw))
        try:
            out = jax.eval_shape(abstract, *dyn)
        except Exception:
            raise NotImplementedError(
                f"{op} has no meta kernel in torch and its impl {impl.name} needs one to trace; "
                f"register one with torch.library.register_fake") from exc
        return jax.tree.map(lambda a: torch.empty(a.shape, dtype=to_torch_dtype(a.dtype), device="meta"), out)


def _check_inplace_cast(op, plan: OpPlan, args, kwargs) -> None:
    """``int_tensor.mul_(2.5)``: torch's CPU kernels refuse a result type that cannot be cast
    back into ``self``; its meta functions do not check, so the check is here."""
    if not plan.mutated or plan.mutated[0] != 0 or not isinstance(args[0], torch.Tensor):
        return
    functional = _functional_twin(op)
    if functional is None:
        return
    try:
        fmargs, fmkwargs = meta_args(args, kwargs)
        result = functional(*fmargs, **fmkwargs)
    except Exception:  # the twin does not take these arguments: nothing to compare
        return
    first = result[0] if isinstance(result, (tuple, list)) else result
    if isinstance(first, torch.Tensor) and not torch.can_cast(first.dtype, args[0].dtype):
        raise RuntimeError(f"{op}: result type {first.dtype} can't be cast to the desired output "
                           f"type {args[0].dtype}")


def _foreach_twin(op) -> Any:
    name = op._schema.name.split("::")[1]
    if not (name.startswith("_foreach") and name.endswith("_")):
        return None
    return getattr(getattr(aten, name[:-1], None), op._overloadname, None)


def _functional_twin(op) -> Any:
    name = op._schema.name.split("::")[1]
    if not name.endswith("_") or name.startswith("_foreach"):
        return None
    try:
        return getattr(getattr(aten, name[:-1]), op._overloadname)
    except AttributeError:
        return None


def _mutated_dtype(args, kwargs, plan: OpPlan, i: int):
    v = args[i] if i < len(args) else kwargs.get(plan.names[i])
    if isinstance(v, (list, tuple)):
        return [x.dtype if x is not None else None for x in v]
    return v.dtype if v is not None else None


def _jit_fn(op, impl: Impl, targs, tkw, func_outs, outs, plan: OpPlan, write_dtypes) -> Callable:
    """The jitted function for one call signature: fills the template, lowers, casts."""
    n_alias_free = [i for i, a in enumerate(plan.alias_returns) if a is None]
    expect = [m for m in outs] if not plan.mutated else None

    def traced(*dyn):
        TRACES[op] = TRACES.get(op, 0) + 1
        key = None
        if impl.random:
            *dyn, kd = dyn
            key = random_state.key_from_data(kd)
        it = iter(dyn)
        a = _fill(targs, it)
        kw = dict((k, _fill(v, it)) for k, v in tkw)
        call = Call(tuple(func_outs), key)
        with lowering(call):
            result = impl.fn(*a, **kw)
        if plan.mutated:
            result = _cast_mutations(op, impl, result, write_dtypes, n_alias_free, outs)
        else:
            result = _cast_outputs(op, impl, result, expect)
        checks[:] = [(exc, msg) for _, exc, msg in call.checks]
        flags = jax.numpy.stack([bad for bad, _, _ in call.checks]) if call.checks else None
        return result, flags

    checks: list = []   # filled at trace time: what each flag means
    jitted = jax.jit(traced)
    jitted.checks = checks
    return jitted


def _flatten(x: Any) -> list:
    if isinstance(x, (list, tuple)):
        out = []
        for y in x:
            out.extend(_flatten(y))
        return out
    return [x]


def _cast_outputs(op, impl, result, expect):
    flat = _flatten(result)
    if len(flat) != len(expect):
        raise RuntimeError(f"{op}: impl {impl.name} ({impl.kind}) returned {len(flat)} outputs, torch expects {len(expect)}")
    out = []
    for r, m in zip(flat, expect):
        if m is None or r is None:
            out.append(r)
            continue
        if tuple(r.shape) != m.shape:
            raise RuntimeError(
                f"{op}: impl {impl.name} ({impl.kind}) returned shape {tuple(r.shape)}, torch's meta "
                f"function says {m.shape}: this is a bug in the impl")
        out.append(r.astype(to_jax_dtype(m.dtype)) if r.dtype != to_jax_dtype(m.dtype) else r)
    return out


def _cast_mutations(op, impl, result, write_dtypes, alias_free, outs):
    """Impls of ops with mutated args return (*alias-free returns, *new values of mutated args)."""
    flat = _flatten(result)
    n_ret = len(alias_free)
    rets = _cast_outputs(op, impl, flat[:n_ret], [outs[i] for i in alias_free]) if n_ret else []
    muts = []
    for v, dt in zip(flat[n_ret:], _flatten(write_dtypes)):
        muts.append(None if v is None or dt is None else v.astype(to_jax_dtype(dt)))
    return rets + muts


def _eager_fn(impl: Impl, targs, tkw) -> Callable:
    def call(*dyn):
        it = iter(dyn)
        a = _fill(targs, it)
        kw = dict((k, _fill(v, it)) for k, v in tkw)
        return impl.fn(*a, **kw)
    return call


# -- results ------------------------------------------------------------------------------------
def _finish(entry: Entry, args, kwargs, split, out) -> Any:
    plan = entry.plan
    eager = entry.impl.data_dependent
    if not plan.mutated:
        return _wrap_tree(out) if eager else _wrap_like(entry.result_meta, iter(out))
    alias_free = [i for i, a in enumerate(plan.alias_returns) if a is None]
    it = iter(_flatten(out) if eager else out)
    rets = [next(it) for _ in alias_free]
    for i in plan.mutated:
        target = args[i] if i < len(args) else kwargs.get(plan.names[i])
        if isinstance(target, (list, tuple)):
            for t in target:
                v = next(it)
                if t is not None and v is not None:
                    write(t, v)
        else:
            v = next(it)
            if target is not None and v is not None:
                write(target, v)
    return _returns(plan, args, kwargs, entry.result_meta, rets)


def _returns(plan: OpPlan, args, kwargs, result_meta, rets: list) -> Any:
    """Rebuild the op's returns: aliased inputs as themselves, the rest wrapped."""
    n = len(plan.alias_returns)
    if n == 0:
        return None
    it = iter(rets)
    if result_meta is None:  # eager (data-dependent) impl: no torch metadata
        metas = [None] * n
    else:
        metas = result_meta if n > 1 else (result_meta,)
    out = []
    for a, m in zip(plan.alias_returns, metas):
        if a is not None:
            out.append(args[a] if a < len(args) else kwargs.get(plan.names[a]))
        else:
            out.append(_wrap_like(m, it))
    return tuple(out) if n > 1 else out[0]


def _wrap_like(meta: Any, it) -> Any:
    if meta is None:
        return _wrap_tree(next(it))
    if isinstance(meta, torch.Tensor):
        return wrap_result(next(it), meta)
    if isinstance(meta, (list, tuple)):
        return type(meta)(_wrap_like(m, it) for m in meta)
    v = next(it)
    return v.item() if hasattr(v, "item") else v


def _wrap_tree(out: Any) -> Any:
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap_tree(x) for x in out)
    if isinstance(out, jax.Array):
        return wrap(out)
    return out


# -- views ----------------------------------------------------------------------------------------


def _run_view(plan: OpPlan, args, kwargs) -> Any:
    op = plan.op
    base = args[0]
    if not isinstance(base, TpuTensor):
        raise _device_error(op, base)
    reinterpret = _REINTERPRET.get(op)
    if reinterpret is not None:
        # A complex <-> real view changes the item size, and conj/neg views are lazy bits
        # torch resolves later; the storage holds plain values of one dtype, so these
        # views are computed as new tensors: they do not alias their base.
        return wrap(reinterpret(value(base)))
    key = (op, tuple(base.shape), base.stride(), base.storage_offset(), base._tpu_storage.numel,
           base.dtype, _freeze(list(args[1:])), _freeze(list(kwargs.items())))
    metas = _VIEW_CACHE.get(key)
    if metas is None:
        margs, mkwargs = meta_args(args, kwargs)
        metas = op(*margs, **mkwargs)
        _VIEW_CACHE.put(key, metas)
    if op is aten.view.dtype and metas.dtype.itemsize != base.dtype.itemsize:
        raise NotImplementedError(f"{op}: viewing {base.dtype} as {metas.dtype} (different item size) is not supported on tpu")
    return _view_like(base, metas)


_REINTERPRET: dict[Any, Callable] = {
    aten.view_as_real.default: lambda z: jax.numpy.stack([z.real, z.imag], axis=-1),
    aten.view_as_complex.default: lambda x: jax.lax.complex(x[..., 0], x[..., 1]),
    # the conj and neg bits are lazy views in torch; here the value is materialised
    aten._conj.default: jax.numpy.conj,
    aten._neg_view.default: jax.numpy.negative,
}


def _view_like(base: TpuTensor, m: Any) -> Any:
    if isinstance(m, (list, tuple)):
        return type(m)(_view_like(base, x) for x in m)
    return TpuTensor(base._tpu_storage, m.shape, m.stride(), m.storage_offset(), m.dtype)


# -- no impl: in-place derivation, decomposition, CPU fallback, or an error -----------------------------
def _derive_inplace(op: OpOverload, margs, mkwargs) -> tuple[Impl | None, Any]:
    """``add_`` runs ``add``'s impl and writes the result into ``self``."""
    functional = _functional_twin(op) or _foreach_twin(op)
    if functional is None:
        return None, None
    impl, _ = REGISTRY.resolve(functional, margs, mkwargs)
    return impl, (functional if impl is not None else None)


_WARNED: set = set()
_DECOMPOSING = threading.local()


def cpu_fallback_enabled() -> bool:
    return os.environ.get("TPU_KERNELS_CPU_FALLBACK", "") not in ("", "0")


def _fallback(op: OpOverload, skipped) -> tuple[str, Callable]:
    from torch._decomp import decomposition_table
    decomp = decomposition_table.get(op)
    if decomp is not None and not REGISTRY.disabled("decomp"):
        def run_decomposition(op, args, kwargs):
            active = _DECOMPOSING.__dict__.setdefault("ops", set())
            if op in active:  # the decomposition calls the op itself: no way down
                raise NotImplementedError(f"{op} has no tpu impl and its decomposition recurses into itself")
            active.add(op)
            try:
                return decomp(*args, **kwargs)
            except NotImplementedError as exc:
                raise NotImplementedError(f"{op} has no tpu impl and its decomposition failed: {exc}") from exc
            finally:
                active.discard(op)
        return "decomp", run_decomposition
    if cpu_fallback_enabled():
        return "cpu", _run_on_cpu
    why = "".join(f"\n  {i.kind}:{i.name} refused: {r}" for i, r in skipped)
    raise NotImplementedError(
        f"{op} has no implementation on the tpu device.{why}\n"
        f"Set TPU_KERNELS_CPU_FALLBACK=1 to run it on the CPU (copying the tensors), or "
        f"register an impl with @tpu_kernel(\"{op._schema.name}.{op._overloadname}\").")


def _to_cpu_tree(v: Any) -> Any:
    if isinstance(v, TpuTensor):
        return to_torch(read(v), v.dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu_tree(x) for x in v)
    if isinstance(v, torch.device) and v.type == "tpu":
        return torch.device("cpu")
    return v


def _to_tpu_tree(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return wrap(to_jax(v), v.dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_tpu_tree(x) for x in v)
    return v


def _run_on_cpu(op: OpOverload, args, kwargs) -> Any:
    if op not in _WARNED:
        _WARNED.add(op)
        warnings.warn(f"tpu_kernels: {op} has no tpu implementation; running it on the CPU "
                      f"(TPU_KERNELS_CPU_FALLBACK=1)", stacklevel=3)
    cargs = [_to_cpu_tree(a) for a in args]
    ckwargs = {k: _to_cpu_tree(v) for k, v in kwargs.items()}
    out = op(*cargs, **ckwargs)
    plan = op_plan(op)
    for i in plan.mutated:  # write mutated CPU copies back
        target = args[i] if i < len(args) else kwargs.get(plan.names[i])
        src = cargs[i] if i < len(args) else ckwargs.get(plan.names[i])
        for t, s in zip(_flatten(target), _flatten(src)):
            if isinstance(t, TpuTensor):
                write(t, to_jax(s))
    if plan.mutated and all(a is not None for a in plan.alias_returns):
        return _returns(plan, args, kwargs, None, [])
    return _to_tpu_tree(out)


def defer_error(op: OpOverload, args, kwargs, exc: Exception) -> Any:
    """Record ``exc`` (see ``errors``) and return zeros shaped like ``op``'s result."""
    errors.defer(exc, str(op))
    try:
        meta = op(*meta_args(args, kwargs)[0], **meta_args(args, kwargs)[1])
    except Exception:  # no shapes to fill: an undefined gradient lets the engine finish
        return None
    return _zeros_like_meta(meta)


def _zeros_like_meta(m: Any) -> Any:
    if isinstance(m, torch.Tensor):
        return wrap(jax.numpy.zeros(tuple(m.shape), to_jax_dtype(m.dtype)), m.dtype)
    if isinstance(m, (list, tuple)):
        return type(m)(_zeros_like_meta(x) for x in m)
    return m


# -- ops handled here, not through the registry ------------------------------------------------------
def _local_scalar_dense(op, args, kwargs):
    errors.raise_pending()
    return value(args[0]).item()


def _to_copy(op, args, kwargs):
    x = args[0]
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "cpu":
        errors.raise_pending()
        out = to_torch(read(x), x.dtype)
        dtype = kwargs.get("dtype")
        return out.to(dtype) if dtype is not None and dtype != out.dtype else out
    kwargs = {k: v for k, v in kwargs.items() if k != "device"}
    return _run_registered(op, args, kwargs)


def _copy_(op, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, TpuTensor):        # tpu -> cpu
        errors.raise_pending()
        dst.copy_(to_torch(read(src), src.dtype))
        return dst
    if not isinstance(src, TpuTensor):        # cpu -> tpu
        return copy_into(dst, src)
    return _run_registered(op, args, kwargs)


def copy_into(dst: TpuTensor, src: torch.Tensor) -> TpuTensor:
    """Copy a CPU tensor into a tpu tensor (broadcast, cast), in place."""
    value = to_jax(src)
    write(dst, value.astype(to_jax_dtype(dst.dtype)) if src.dtype != dst.dtype else value)
    return dst


def _native_batch_norm(op, args, kwargs):
    """``native_batch_norm`` updates the running stats in place without saying so in its
    schema; ``_native_batch_norm_legit`` means the same and declares the mutation."""
    a = list(args) + [None] * (8 - len(args))
    names = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")
    a = [kwargs.get(n, v) for n, v in zip(names, a)]
    if a[5] and a[3] is not None:
        return aten._native_batch_norm_legit.default(*a)
    return _run_registered(op, args, kwargs)


_SPECIAL: dict[Any, Callable] = {
    aten.native_batch_norm.default: _native_batch_norm,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
}


def register_special(op: OpOverload, fn: Callable) -> None:
    """Handle ``op`` with ``fn(op, args, kwargs)`` before the registry (runtime-level ops)."""
    _SPECIAL[op] = fn


# -- introspection ---------------------------------------------------------------------------------------
def op_counts() -> dict[tuple[str, str], int]:
    """Calls per (op, impl kind) since start: what the demo's table shows."""
    counts: dict[tuple[str, str], int] = dict(_RETIRED)
    for e in _CACHE.values():
        k = (str(e.plan.op), e.impl.kind)
        counts[k] = counts.get(k, 0) + e.calls
    return counts


def cache_info() -> dict[str, Any]:
    """Hits, misses, evictions and size of the executable cache and the view cache."""
    return {"ops": _CACHE.info(), "views": _VIEW_CACHE.info()}


def clear_cache() -> None:
    _CACHE.clear()
    _RETIRED.clear()
    _VIEW_CACHE.clear()
    TRACES.clear()


# The entry every tpu tensor's __torch_dispatch__ calls. Dynamo must never trace the
# runtime itself (it would trace into JAX), so under torch.compile each tpu op runs here
# eagerly, as a graph break.
entry = torch._dynamo.disable(run, recursive=True)
