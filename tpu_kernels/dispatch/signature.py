"""A call split into its signature (hashable: the cache key's body) and its dynamic leaves
(tensors and traced scalars, passed to the jitted function)."""
from __future__ import annotations

from typing import Any

import torch

from tpu_kernels.dispatch.devices import cpu_arg_allowed, device_error
from tpu_kernels.dispatch.plan import SCALAR, SCALAR_LIST, SLOT, STATIC, TENSOR, TENSOR_LIST, OpPlan
from tpu_kernels.storage import to_jax
from tpu_kernels.tensor import TpuTensor, read


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
                # a CPU tensor where torch lets a CUDA op take one (devices.py: the rule)
                if not cpu_arg_allowed(self.op, name, v):
                    raise _Foreign(v)
                self.leaves.append(v)
                self.sig.append(("cpu", v.shape, v.dtype))
                return SLOT
            if type(v) in (int, float, bool):  # a wrapped number in a Tensor slot (x / 2.0)
                self.leaves.append(v)
                self.sig.append(type(v))
                return SLOT
            return freeze(v)
        if kind == TENSOR_LIST:
            return None if v is None else tuple(self.conv(TENSOR, name, x) for x in v)
        if kind == SCALAR_LIST and isinstance(v, (list, tuple)):
            return tuple(self.conv(SCALAR, name, x) for x in v)
        if kind == SCALAR and type(v) in (int, float, bool) and name not in self.static_scalars:
            self.leaves.append(v)
            self.sig.append(type(v))
            return SLOT
        return freeze(v)


def split(plan: OpPlan, args: tuple, kwargs: dict, static_scalars: tuple[str, ...] = ()) -> tuple[Split, tuple, tuple]:
    s = Split(plan.op, static_scalars)
    kinds, names = plan.pos_kinds, plan.names
    targs = []
    try:
        for i, a in enumerate(args):
            if type(a) is TpuTensor and kinds[i] == TENSOR:   # the common case, inlined
                s.leaves.append(a)
                s.sig.append((a.shape, a.dtype))
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


def leaf_value(v: Any) -> Any:
    if isinstance(v, TpuTensor):
        return read(v)
    if isinstance(v, torch.Tensor):
        return to_jax(v)
    return v
