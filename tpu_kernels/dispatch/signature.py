"""A call split into its signature (hashable: the cache key's body) and its dynamic leaves
(tensors and traced scalars, passed to the jitted function)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tpu_kernels.dispatch.devices import cpu_arg_allowed, device_error
from tpu_kernels.dispatch.plan import SCALAR, SCALAR_LIST, SLOT, STATIC, TENSOR, TENSOR_LIST, OpPlan
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.storage import to_jax, view_reader
from tpu_kernels.tensor import TpuTensor
from tpu_kernels.tensor_values import read, storage_value
def freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(freeze(x) for x in v)
    if isinstance(v, torch.Tensor):  # a tensor in a non-tensor slot (rare): key by identity
        return ("tensor", id(v))
    return v


class _Foreign(Exception):
    """A CPU tensor torch does not let the op take (raised as torch's error by ``split``)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class Split:
    """A call split into a hashable template and its dynamic leaves. ``reads``: per leaf,
    for a view whose read the op's program does itself, ``storage array -> view value``
    (``view_read``); else None."""
    __slots__ = ("leaves", "sig", "op", "static_scalars", "reads")

    def __init__(self, op, static_scalars):
        self.leaves: list[Any] = []
        self.sig: list[Any] = []
        self.reads: list[Any] = []
        self.op = op
        self.static_scalars = static_scalars

    def tensor(self, v: TpuTensor) -> None:
        self.leaves.append(v)
        if v._tpu_direct:
            self.sig.append((v.shape, v.dtype))
            self.reads.append(None)
            return
        geometry = view_geometry(v)
        r = view_reader(*geometry)
        self.sig.append((v.shape, v.dtype, geometry) if r is not None else (v.shape, v.dtype))
        self.reads.append(r)

    def conv(self, kind: str, name: str, v: Any) -> Any:
        if kind == TENSOR:
            if v is None:
                return None
            if isinstance(v, TpuTensor):
                self.tensor(v)
                return SLOT
            if isinstance(v, torch.Tensor):
                # a CPU tensor where torch lets a CUDA op take one (devices.py: the rule)
                if not cpu_arg_allowed(self.op, name, v):
                    raise _Foreign(v)
                self.leaves.append(v)
                self.sig.append(("cpu", v.shape, v.dtype))
                self.reads.append(None)
                return SLOT
            if type(v) in (int, float, bool):  # a wrapped number in a Tensor slot (x / 2.0)
                self.leaves.append(v)
                self.sig.append(type(v))
                self.reads.append(None)
                return SLOT
            return freeze(v)
        if kind == TENSOR_LIST:
            return None if v is None else tuple(self.conv(TENSOR, name, x) for x in v)
        if kind == SCALAR_LIST and isinstance(v, (list, tuple)):
            return tuple(self.conv(SCALAR, name, x) for x in v)
        if kind == SCALAR and type(v) in (int, float, bool) and name not in self.static_scalars:
            self.leaves.append(v)
            self.sig.append(type(v))
            self.reads.append(None)
            return SLOT
        return freeze(v)


def split(plan: OpPlan, args: tuple, kwargs: dict, static_scalars: tuple[str, ...] = ()) -> tuple[Split, tuple, tuple]:
    s = Split(plan.op, static_scalars)
    kinds, names = plan.pos_kinds, plan.names
    targs = []
    try:
        for i, a in enumerate(args):
            if type(a) is TpuTensor and kinds[i] == TENSOR:   # the common case
                s.tensor(a)
                targs.append(SLOT)
            else:
                targs.append(s.conv(kinds[i], names[i], a))
        targs = tuple(targs)
        tkw = tuple((k, s.conv(plan.kw_kinds.get(k, STATIC), k, v)) for k, v in kwargs.items())
    except _Foreign as exc:   # torch's message names the call's tpu device: found here
        raise device_error(plan.op, exc.tensor, (args, kwargs)) from None
    return s, targs, tkw


def fill(template: Any, it) -> Any:
    if template is SLOT:
        return next(it)
    if type(template) is tuple:
        return tuple(fill(x, it) for x in template)
    return template


def fill_call(targs: tuple, tkw: tuple, leaves) -> tuple[tuple, dict]:
    """The call's arguments again: the template with ``leaves`` in its slots."""
    it = iter(leaves)
    return fill(targs, it), dict((k, fill(v, it)) for k, v in tkw)


def view_geometry(v: TpuTensor) -> tuple:
    """What ``storage.view_reader`` needs to read the view ``v`` from its storage's array."""
    a = v._tpu_storage.array
    return (tuple(a.shape), tuple(v.shape), v.stride(), v.storage_offset(), np.dtype(a.dtype),
            np.dtype(to_jax_dtype(v.dtype)))


def view_read(reads: tuple, leaves: list) -> list:
    """``leaves`` with each folded view's read applied (inside the op's program)."""
    return [v if r is None else r(v) for r, v in zip(reads, leaves)]


def leaf_value(v: Any, folded: Any = None) -> Any:
    """The value the op's program takes for leaf ``v``: a tensor's value, or for a view
    whose read the program does (``folded``), its storage's array."""
    if isinstance(v, TpuTensor):
        return read(v) if folded is None else storage_value(v)
    if isinstance(v, torch.Tensor):
        return to_jax(v)
    return v
