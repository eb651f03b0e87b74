"""Meta arguments and results: torch's meta functions are the source of truth for a
result's shape and dtype (and give torch's own error for bad arguments)."""
from __future__ import annotations

from typing import Any

import jax
import torch
from torch.utils._pytree import tree_map

from tpu_kernels.dispatch import dynamo_free
from tpu_kernels.dispatch.devices import meta_of_cpu
from tpu_kernels.dispatch.plan import op_plan
from tpu_kernels.dispatch.signature import fill_call, split
from tpu_kernels.registry import Impl
from tpu_kernels.registry.context import Call, OutMeta, lowering
from tpu_kernels.registry.dtypes import to_jax_dtype, to_torch_dtype
from tpu_kernels.tensor import TpuTensor


def _to_meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        if isinstance(v, TpuTensor):
            base = torch.empty(v._tpu_storage.numel, dtype=v.dtype, device="meta")
            return base.as_strided(v.shape, v.stride(), v.storage_offset())
        return meta_of_cpu(v)  # a CPU tensor the call may take (devices.py)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_meta(x) for x in v)
    if isinstance(v, torch.device) and v.type == "tpu":
        return torch.device("meta")
    return v


def meta_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with tpu tensors as meta tensors of the same geometry (what ``supports``
    predicates and torch's meta functions see)."""
    dynamo_free.prepare()   # before the first meta function runs
    return tuple(_to_meta(a) for a in args), {k: _to_meta(v) for k, v in kwargs.items()}


def meta_call(op: Any, args: tuple, kwargs: dict) -> Any:
    """``op`` run on the call's meta arguments: torch's meta result."""
    margs, mkwargs = meta_args(args, kwargs)
    return _torch_meta(op, margs, mkwargs, args, kwargs)


# A CPU stand-in larger than this many elements is not made: the meta function's error stays.
PROBE_LIMIT = 1 << 22


def _torch_meta(op: Any, margs: tuple, mkwargs: dict, args: tuple, kwargs: dict) -> Any:
    """torch's meta result; for arguments the op refuses, torch's CPU kernel's error.

    A meta function checks what the kernels check, but often in its own words ("a and b
    must have same reduction dim" where CPU and CUDA say "mat1 and mat2 shapes cannot be
    multiplied"); a user sees the kernel's words on CUDA. So when the meta function
    refuses, the call runs once on zero-filled CPU stand-ins of the same geometry and
    that error is raised (only on this error path; meta functions check geometry and
    dtypes, not values, so the stand-ins' values do not matter)."""
    try:
        return op(*margs, **mkwargs)
    except (ZeroDivisionError, TypeError) as exc:
        # a meta function that is a decomposition dividing by numel() (mse_loss_backward
        # of an empty input), or one passing torch._check an int (upsample_nearest1d of an
        # empty batch): not an argument check; CPU's kernel gives the result's layout
        if isinstance(exc, TypeError) and not str(exc).startswith("cond must be a bool"):
            raise
        cpu, out = cpu_probe(op, args, kwargs)
        if cpu is not None or out is None:
            raise
        return tree_map(_meta_like, out)
    except (RuntimeError, ValueError, IndexError, AssertionError) as exc:
        # AssertionError: Python decompositions used as meta functions (grid_sampler_2d)
        # assert where CPU's kernel raises RuntimeError
        cpu = cpu_error(op, args, kwargs)
        if cpu is None:
            raise
        raise cpu from exc


def _meta_like(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


def cpu_error(op: Any, args: tuple, kwargs: dict) -> Exception | None:
    """The error torch's CPU kernel raises for the call on stand-ins; None when it raises
    none (or the stand-ins would be too big to make)."""
    return cpu_probe(op, args, kwargs)[0]


def cpu_probe(op: Any, args: tuple, kwargs: dict) -> tuple[Exception | None, Any]:
    """(the error, the result) of torch's CPU kernel on zero-filled stand-ins of the call's
    tpu tensors; (None, None) when the stand-ins would be too big to make or the kernel
    fails another way."""
    budget = [PROBE_LIMIT]

    def stand_in(v: Any) -> Any:
        if isinstance(v, TpuTensor):
            n = v._tpu_storage.numel
            budget[0] -= n
            if budget[0] < 0:
                raise OverflowError
            return torch.zeros(n, dtype=v.dtype).as_strided(v.shape, v.stride(), v.storage_offset())
        if isinstance(v, (list, tuple)):
            return type(v)(stand_in(x) for x in v)
        if isinstance(v, torch.device) and v.type == "tpu":
            return torch.device("cpu")
        return v
    try:
        cargs, ckwargs = tuple(stand_in(a) for a in args), {k: stand_in(v) for k, v in kwargs.items()}
    except OverflowError:
        return None, None
    try:
        return None, op(*cargs, **ckwargs)
    except (RuntimeError, ValueError, IndexError) as exc:
        return exc, None
    except Exception:  # noqa: BLE001 - a different kind of failure: keep the meta error
        return None, None


def out_metas(out: Any) -> list[OutMeta | None]:
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


def meta_result(op, impl: Impl, margs, mkwargs, targs, tkw, args, kwargs) -> Any:
    """torch's meta result (shapes, dtypes, and torch's own error for bad arguments).

    An op with no meta kernel takes its result's metadata from the impl, traced
    abstractly; an impl that needs torch's metadata to trace cannot run such an op.
    """
    try:
        return _torch_meta(op, margs, mkwargs, args, kwargs)
    except (NotImplementedError, AttributeError, TypeError) as exc:
        # no meta kernel, or a meta kernel that breaks on valid input (e.g. reading the
        # device of a None bias): take the metadata from the impl instead
        if isinstance(exc, NotImplementedError) and "Meta" not in str(exc):
            raise
        dyn = [jax.ShapeDtypeStruct(tuple(v.shape), to_jax_dtype(v.dtype)) if isinstance(v, torch.Tensor)
               else v for v in split(op_plan(op), args, kwargs, impl.static)[0].leaves]

        def abstract(*leaves):
            a, kw = fill_call(targs, tkw, leaves)
            with lowering(Call((), None)):
                return impl.fn(*a, **kw)
        try:
            out = jax.eval_shape(abstract, *dyn)
        except Exception:
            raise NotImplementedError(
                f"{op} has no meta kernel in torch and its impl {impl.name} needs one to trace; "
                f"register one with torch.library.register_fake") from exc
        return jax.tree.map(lambda a: torch.empty(a.shape, dtype=to_torch_dtype(a.dtype), device="meta"), out)
