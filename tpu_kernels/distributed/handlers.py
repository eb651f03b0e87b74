"""What every c10d op handler shares: its arguments bound by schema name, the checks every
collective makes (tpu tensors only, a supported reduce op), its group and its work handle,
and the wrapper (``handler``) that turns ``fn(args) -> result`` into a runtime handler that
records, rather than raises, an error inside torch's autograd engine (backward)."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch

from tpu_kernels import errors
from tpu_kernels.distributed import groups, programs
from tpu_kernels.distributed.groups import Group
from tpu_kernels.distributed.work import TpuWork
from tpu_kernels.tensor import TpuTensor


def bind(op, args: tuple, kwargs: dict) -> dict[str, Any]:
    """An op call's arguments by schema name, defaults filled in."""
    out = {}
    for i, a in enumerate(op._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def reduce_name(reduce_op: Any, collective: str) -> str:
    """``ReduceOp`` (a c10d ScriptObject, enum, or functional string) -> our op name."""
    if isinstance(reduce_op, torch.ScriptObject):
        reduce_op = reduce_op.op()
    if isinstance(reduce_op, int):
        reduce_op = torch.distributed.ReduceOp.RedOpType(reduce_op)
    name = reduce_op if isinstance(reduce_op, str) else reduce_op.name
    name = name.lower()
    if name not in programs.REDUCE_OPS:
        raise NotImplementedError(
            f"tpu {collective}: reduce op {name.upper()} is not supported on tpu (supported: "
            f"{', '.join(o.upper() for o in programs.REDUCE_OPS)}); for PREMUL_SUM scale the "
            f"tensor first and use SUM")
    return name


def tpu_tensors(collective: str, tensors: list, what: str = "tensor") -> list[TpuTensor]:
    """``tensors``, checked to be tpu tensors (a CPU tensor among them is a user error)."""
    for i, t in enumerate(tensors):
        if not isinstance(t, TpuTensor):
            where = getattr(t, "device", type(t).__name__)
            raise ValueError(
                f"tpu {collective}: {what} {i} is on {where}, the others on tpu: all tensors "
                f"of one collective must be on the same device. Move it with .to('tpu') "
                f"(or run the collective on CPU tensors only)")
    return tensors


def expect(collective: str, cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"tpu {collective}: {message}")


def op_group(a: dict, name: str) -> Group:
    """The op's group; its timeout is the op's own (``Options.timeout``) when it has one."""
    group = groups.of(a["process_group"], name)
    ms = a.get("timeout", -1)
    return dataclasses.replace(group, timeout=ms / 1000) if ms and ms > 0 else group


def work_handle(name: str, group: Group, arrays: list, result: Any) -> Any:
    return TpuWork(name, group, [a for a in arrays if a is not None], result).boxed()


def handler(name: str, returns_tensors: str | None) -> Callable:
    """Register-ready handler around ``fn(a: dict) -> result`` for collective ``name``.

    Inside torch's autograd engine (DDP's gradient hooks, during backward) an exception
    escaping into C++ would abort the process: there the error is recorded and raised at
    the next tpu op after backward, and the op returns its inputs with a finished handle.
    """
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(op, args, kwargs):
            a = bind(op, args, kwargs)
            try:
                return fn(a)
            except Exception as exc:
                if not errors.in_backward():
                    raise
                errors.defer(exc, f"tpu {name}")
                dummy = TpuWork(name, Group("?", (0,), 0, 1.0), [], None).boxed()
                return (a[returns_tensors], dummy) if returns_tensors else dummy
        run.collective = name
        return run
    return wrap
