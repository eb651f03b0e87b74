"""Calls that run in torch land rather than as one jitted impl: a decomposition (its ops
dispatch again), the CPU fallback (copies there and back), a factory-like call whose
result lives on another device (``zeros_like(t, device="cpu")``), and an error inside
torch's autograd engine, during backward (recorded, zeros returned; see errors.py)."""
from __future__ import annotations

import threading
import warnings
from typing import Any, Callable

import jax
import torch
from torch._ops import OpOverload

from tpu_kernels import errors
from tpu_kernels.dispatch.lowering import flatten
from tpu_kernels.dispatch.meta import meta_call
from tpu_kernels.dispatch.plan import op_plan
from tpu_kernels.dispatch.results import returns
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.storage import to_jax, to_torch
from tpu_kernels.tensor import TpuTensor, wrap
from tpu_kernels.tensor_values import read, write
_WARNED: set = set()
_DECOMPOSING = threading.local()


def decomposition_runner(decomp: Callable) -> Callable:
    """``run(op, args, kwargs)`` through ``decomp``, refusing a decomposition that calls
    the op itself (there is no way down)."""
    def run_decomposition(op, args, kwargs):
        active = _DECOMPOSING.__dict__.setdefault("ops", set())
        if op in active:
            raise NotImplementedError(f"{op} has no tpu impl and its decomposition recurses into itself")
        active.add(op)
        try:
            return decomp(*args, **kwargs)
        except NotImplementedError as exc:
            raise NotImplementedError(f"{op} has no tpu impl and its decomposition failed: {exc}") from exc
        finally:
            active.discard(op)
    return run_decomposition


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


def run_on_cpu(op: OpOverload, args, kwargs) -> Any:
    """The op on CPU copies of its arguments; mutated arguments written back (warns once per op)."""
    if op not in _WARNED:
        _WARNED.add(op)
        warnings.warn(f"tpu_kernels: {op} has no tpu implementation; running it on the CPU "
                      f"(TPU_KERNELS_CPU_FALLBACK=1)", stacklevel=3)
    cargs = [_to_cpu_tree(a) for a in args]
    ckwargs = {k: _to_cpu_tree(v) for k, v in kwargs.items()}
    out = op(*cargs, **ckwargs)
    plan = op_plan(op)
    for i in plan.mutated:  # write mutated CPU copies back
        target, src = plan.arg(i, args, kwargs), plan.arg(i, cargs, ckwargs)
        for t, s in zip(flatten(target), flatten(src)):
            if isinstance(t, TpuTensor):
                write(t, to_jax(s))
    if plan.mutated and all(a is not None for a in plan.alias_returns):
        return returns(plan, args, kwargs, None, [])
    return _to_tpu_tree(out)


def elsewhere(kwargs: dict) -> bool:
    """The call asks for its result on another device than a tpu (``zeros_like(t,
    device="cpu")``, ``t.new_empty(2, device="meta")``)."""
    d = kwargs.get("device")
    return d is not None and torch.device(d).type != "tpu"


def run_elsewhere(op: OpOverload, args, kwargs) -> Any:
    """A call whose result lives on another device: torch's own kernel there. A ``*_like``
    / ``new_*`` op reads its input's metadata only: it gets stand-ins with the tpu
    arguments' sizes, strides and dtypes (no copy, no wait). Any other op (``linspace`` of
    tpu scalar tensors, whose ``device`` defaults to the CPU) reads values: on the CPU it
    gets copies of them, on the meta device stand-ins."""
    device = torch.device(kwargs["device"])
    name = op._opname
    if device.type == "cpu" and not (name.endswith("_like") or name.startswith("new_")):
        return op(*[_to_cpu_tree(a) for a in args], **kwargs)

    def standin(v: Any) -> Any:
        if isinstance(v, TpuTensor):
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)
        return v
    return op(*[standin(a) for a in args], **kwargs)


def defer_error(op: OpOverload, args, kwargs, exc: Exception) -> Any:
    """Record ``exc`` (see ``errors``) and return zeros shaped like ``op``'s result."""
    errors.defer(exc, str(op))
    try:
        meta = meta_call(op, args, kwargs)
    except Exception:  # no shapes to fill: an undefined gradient lets the engine finish
        return None
    return _zeros_like_meta(meta)


def _zeros_like_meta(m: Any) -> Any:
    if isinstance(m, torch.Tensor):
        return wrap(jax.numpy.zeros(tuple(m.shape), to_jax_dtype(m.dtype)), m.dtype)
    if isinstance(m, (list, tuple)):
        return type(m)(_zeros_like_meta(x) for x in m)
    return m
