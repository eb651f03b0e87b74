"""An op's results as torch wants them: new tpu tensors wrapped around the jax results,
aliased inputs returned as themselves, mutated arguments written in place."""
from __future__ import annotations

import weakref
from typing import Any

import jax
import numpy as np
import torch

from tpu_kernels import strided
from tpu_kernels.dispatch import graph_trace
from tpu_kernels.dispatch.cache import CompiledCall
from tpu_kernels.dispatch.lowering import flatten
from tpu_kernels.dispatch.overlap import check_written
from tpu_kernels.dispatch.plan import OpPlan
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.storage import Storage, to_dense
from tpu_kernels.tensor import TpuTensor, wrap, wrap_known
from tpu_kernels.tensor_values import read, write, write_all
def finish(compiled: CompiledCall, args, kwargs, out) -> Any:
    """The op's returns from the impl's output ``out``; mutated arguments written."""
    single = compiled.single_out
    if single is not None and not graph_trace.active():   # the common eager case
        return wrap_known(out[0], *single)
    plan = compiled.plan
    eager = compiled.impl.data_dependent
    if not plan.mutated:
        if eager:
            return wrap_tree(out)
        known = _known_outs(compiled)
        if known is not None and not graph_trace.active():   # several plain results (layer norm's three)
            geometries, kind = known
            return kind(wrap_known(a, *g) for a, g in zip(out, geometries))
        return _wrap_like(compiled.result_meta, iter(out), laid_out=True)   # build: dense_orders
    alias_free = [i for i, a in enumerate(plan.alias_returns) if a is None]
    it = iter(flatten(out) if eager else out)
    rets = [next(it) for _ in alias_free]
    for i in plan.mutated:   # torch's overlap checks, before anything is written
        check_written(plan.op, args[i] if i < len(args) else kwargs.get(plan.names[i]), args, kwargs)
    for i in plan.mutated:
        target = plan.arg(i, args, kwargs)
        if isinstance(target, (list, tuple)):   # (a foreach op's: views of one storage together)
            values = [next(it) for _ in target]
            write_all([(t, v) for t, v in zip(target, values) if t is not None and v is not None])
        else:
            v = next(it)
            if target is not None and v is not None:
                write(target, v)
    return returns(plan, args, kwargs, compiled.result_meta, rets)


_UNSET = object()
# CompiledCall -> what ``_known_outs`` found for it (weak: evicted calls drop out)
_KNOWN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _known_outs(compiled: CompiledCall) -> tuple | None:
    """For an op returning a tuple (or list) of non-empty contiguous tensors and nothing
    else: each one's (sizes, strides, dtype, bytes), and the container type, worked out
    once per signature so ``wrap_known`` wraps them (``wrap_result`` redoes it per call);
    None for any other return."""
    found = _KNOWN.get(compiled, _UNSET)
    if found is _UNSET:
        found = _KNOWN[compiled] = _geometries(compiled.result_meta)
    return found


def _geometries(meta: Any) -> tuple | None:
    if type(meta) not in (tuple, list) or not meta:
        return None
    out = []
    for m in meta:
        if not isinstance(m, torch.Tensor) or m.numel() == 0:
            return None
        size = tuple(m.shape)
        stride = strided.contiguous_strides(size)
        if tuple(m.stride()) != stride:
            return None
        out.append((size, stride, m.dtype, m.numel() * np.dtype(to_jax_dtype(m.dtype)).itemsize))
    return tuple(out), type(meta)


def returns(plan: OpPlan, args, kwargs, result_meta, rets: list) -> Any:
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
            out.append(plan.arg(a, args, kwargs))
        else:
            # the op's executable laid out its non-contiguous results (build: dense_orders)
            out.append(_wrap_like(m, it, laid_out=not plan.mutated))
    return tuple(out) if n > 1 else out[0]


def _wrap_like(meta: Any, it, laid_out: bool) -> Any:
    if meta is None:
        return wrap_tree(next(it))
    if isinstance(meta, torch.Tensor):
        return wrap_result(next(it), meta, laid_out)
    if isinstance(meta, (list, tuple)):
        return type(meta)(_wrap_like(m, it, laid_out) for m in meta)
    v = next(it)
    if isinstance(v, jax.core.Tracer):   # inside a program: torch's meta number is the value
        return meta                       # (an attention's max_q/max_k: sequence lengths)
    return v.item() if hasattr(v, "item") else v


def wrap_tree(out: Any) -> Any:
    if isinstance(out, (list, tuple)):
        return type(out)(wrap_tree(x) for x in out)
    if isinstance(out, jax.Array):
        return wrap(out)
    return out


def wrap_result(array: jax.Array, meta: torch.Tensor, laid_out: bool = False) -> TpuTensor:
    """An op's result, with the strides torch's meta function gave: a compiled graph's later
    views (recorded by AOTAutograd against those strides) and DTensor (which keeps the
    meta's strides as the global tensor's and views local tensors by them) must cut the
    same elements. Nearly every result is contiguous; attention outputs and their
    gradients are not (they follow the query's layout, as torch's kernels do). ``array``
    has the meta's shape or, ``laid_out``, is already the storage in that layout, its dims
    transposed to memory order (``dense_order``: an op's executable lays such results out
    itself)."""
    stride, shape = meta.stride(), tuple(meta.shape)
    if stride == strided.contiguous_strides(shape):
        return wrap(array, meta.dtype)
    order = strided.memory_order(shape, stride)
    if order is None:   # not a dense layout (torch's meta functions rarely say so)
        return wrap(array, meta.dtype)
    if not laid_out:
        array = to_dense(array, order)
    return TpuTensor(Storage(array), shape, stride, 0, meta.dtype)


def dense_order(meta: Any) -> tuple[int, ...] | None:
    """For a result torch lays out densely but not contiguously (an attention output in the
    query's layout): the memory order its executable writes it in (``wrap_result`` then
    takes the flat array as its storage: no program of its own, and nothing a warm
    process traces). None for every other result (two or more dims only: a flat array
    then tells the two cases apart)."""
    if not isinstance(meta, torch.Tensor) or meta.dim() < 2:
        return None
    shape, stride = tuple(meta.shape), meta.stride()
    if stride == strided.contiguous_strides(shape):
        return None
    return strided.memory_order(shape, stride)


def dense_orders(result_meta: Any) -> list:
    """``dense_order`` of each of an op's results, flat, in ``meta.out_metas``' order."""
    return [dense_order(x) for x in flatten(result_meta)]


_CHANNELS_LAST = (torch.channels_last, torch.channels_last_3d)


def laid_out(out: TpuTensor, x: torch.Tensor, memory_format) -> TpuTensor:
    """``out`` (contiguous) in the layout torch gives a copy of ``x`` in ``memory_format``,
    for the channels-last formats (and ``preserve_format`` of a channels-last ``x``)."""
    if memory_format not in _CHANNELS_LAST and not (
            memory_format in (None, torch.preserve_format) and x.dim() in (4, 5)
            and not x.is_contiguous() and x.is_contiguous(memory_format=_CHANNELS_LAST[x.dim() - 4])):
        return out
    fmt = memory_format if memory_format in _CHANNELS_LAST else _CHANNELS_LAST[x.dim() - 4]
    stride = torch.empty(out.shape, device="meta").contiguous(memory_format=fmt).stride()
    order = strided.memory_order(tuple(out.shape), stride)
    if order is None or stride == out.stride():
        return out
    return TpuTensor(Storage(to_dense(read(out), order), out._tpu_storage.index), out.shape, stride, 0, out.dtype)
