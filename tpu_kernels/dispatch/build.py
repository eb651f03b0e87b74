"""A call signature seen for the first time: ask the route what runs, run torch's meta
function for the result's metadata, and build the ``CompiledCall`` every later call with
this signature reuses."""
from __future__ import annotations

import logging

import numpy as np
import torch

from tpu_kernels import devices, strided
from tpu_kernels.dispatch import call_cache, call_key
from tpu_kernels.dispatch.cache import CompiledCall
from tpu_kernels.dispatch.devices import named_index
from tpu_kernels.dispatch.fallback import decomposition_runner, elsewhere, run_elsewhere, run_on_cpu
from tpu_kernels.dispatch.lowering import eager_fn, jit_fn
from tpu_kernels.dispatch.memory import guard_memory
from tpu_kernels.dispatch.meta import meta_args, meta_call, meta_result, out_metas
from tpu_kernels.dispatch.plan import OpPlan
from tpu_kernels.dispatch.results import dense_orders
from tpu_kernels.registry import Route
from tpu_kernels.registry.dtypes import cast_error, to_jax_dtype
from tpu_kernels.registry.opnames import functional_twin
from tpu_kernels.registry.route import call_route

log = logging.getLogger("tpu_kernels.dispatch")


def build(plan: OpPlan, args, kwargs, targs, tkw, reads: tuple = ()) -> CompiledCall:
    """The ``CompiledCall`` of a call signature; ``reads``: per leaf, the read of a view
    the program does itself from the storage's array (``signature.Split.reads``)."""
    op = plan.op
    margs, mkwargs = meta_args(args, kwargs)
    r = call_route(op, margs, mkwargs)
    if r.kind == "refused":
        raise r.error()
    if r.kind in ("decomp", "cpu"):
        torch_fn = decomposition_runner(r.impl.fn) if r.kind == "decomp" else run_on_cpu
        return CompiledCall(r.impl, None, plan, None, [], torch_fn=torch_fn)
    if elsewhere(kwargs):   # the device keyword is part of the signature: decided once
        return CompiledCall(r.impl, None, plan, None, [], torch_fn=run_elsewhere)
    impl = r.impl
    if impl.data_dependent:
        return CompiledCall(impl, eager_fn(impl, targs, tkw, reads), plan, None, [])
    entry = _cache_entry(r, plan, args, kwargs, targs, tkw)
    loaded = entry.load() if entry is not None else None
    if loaded is not None:   # a signature an earlier process ran: its metadata is known
        result_meta, func_outs = loaded["result_meta"], loaded["func_outs"]
        outs = out_metas(result_meta)
        guard_memory(op, outs)
    else:
        result_meta = meta_result(op, impl, margs, mkwargs, targs, tkw, args, kwargs)
        outs = out_metas(result_meta)
        guard_memory(op, outs)
        # a twin's impl returns what the functional op returns
        func_outs = out_metas(meta_call(r.functional, args, kwargs)) if r.kind == "twin" else outs
        _check_inplace_cast(op, plan, args, kwargs)
    write_dtypes = [_mutated_dtype(plan.arg(i, args, kwargs)) for i in plan.mutated]
    # results laid out by the executable itself: a non-mutating op's only (mutated ops'
    # returns are rare and wrapped as before)
    orders = dense_orders(result_meta) if not plan.mutated else []
    fn = jit_fn(op, impl, targs, tkw, func_outs, outs, plan, write_dtypes, reads,
                checks=loaded["checks"] if loaded is not None else None,
                orders=orders if any(o is not None for o in orders) else None,
                # several devices: a result follows its inputs unless a device is named
                keep_inputs=devices.several and named_index(kwargs) is None)
    compiled = CompiledCall(impl, fn, plan, result_meta, write_dtypes, single_out=_single_out(plan, result_meta))
    if entry is not None:
        compiled.fn = compiled.call = entry.runner(fn, loaded, result_meta, func_outs, settled=compiled)
    _log(r)
    return compiled


def _cache_entry(r: Route, plan: OpPlan, args, kwargs, targs, tkw) -> call_cache.Entry | None:
    """The signature's place in the persistent call cache, or None (off, or no exact key)."""
    where = call_cache.directory()
    if where is None:
        return None
    key = call_key.key_text(r.op, r.kind, r.impl, plan, args, kwargs, targs, tkw)
    return call_cache.Entry(where, key) if key is not None else None


def _single_out(plan: OpPlan, result_meta) -> tuple | None:
    """The geometry of an op's one returned tensor when eager wraps it as is (see
    ``results.finish``): (sizes, strides, dtype, bytes); None for every other kind of return."""
    if plan.mutated or not isinstance(result_meta, torch.Tensor) or result_meta.numel() == 0:
        return None
    size, stride = tuple(result_meta.shape), strided.contiguous_strides(tuple(result_meta.shape))
    if tuple(result_meta.stride()) != stride:   # kept in torch's layout (results.wrap_result)
        return None
    nbytes = result_meta.numel() * np.dtype(to_jax_dtype(result_meta.dtype)).itemsize
    return size, stride, result_meta.dtype, nbytes


def _log(r: Route) -> None:
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s -> %s %s (skipped: %s)", r.op, r.kind, r.impl, [(i.name, why) for i, why in r.skipped])


def _check_inplace_cast(op, plan: OpPlan, args, kwargs) -> None:
    """``int_tensor.mul_(2.5)``: torch's CPU kernels refuse a result type that cannot be cast
    back into ``self``; its meta functions do not check, so the check is here."""
    if not plan.mutated or plan.mutated[0] != 0 or not isinstance(args[0], torch.Tensor):
        return
    functional = functional_twin(op)
    if functional is None:
        return
    try:
        result = meta_call(functional, args, kwargs)
    except Exception:  # the twin does not take these arguments: nothing to compare
        return
    first = result[0] if isinstance(result, (tuple, list)) else result
    if isinstance(first, torch.Tensor) and not torch.can_cast(first.dtype, args[0].dtype):
        raise cast_error(first.dtype, args[0].dtype)


def _mutated_dtype(v):
    if isinstance(v, (list, tuple)):
        return [x.dtype if x is not None else None for x in v]
    return v.dtype if v is not None else None
