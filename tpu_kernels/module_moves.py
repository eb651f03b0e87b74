"""``Module._apply`` (``.to``, ``.half()``, ``.cpu()``...) for modules with tpu tensors.

torch converts a parameter by swapping it with its converted value when that value is a
wrapper subclass (every tpu tensor is one), and refuses to swap a tensor that is weakly
referenced. Compiled code holds tpu tensors weakly (their shadows, Dynamo's guards), so
without this module a model that had run compiled could not be moved or cast again.
Installed when imported (``tpu_kernels/__init__``).
"""
from __future__ import annotations

import functools
import itertools
import threading
import weakref
from typing import Callable

import torch

from tpu_kernels.tensor import TpuTensor


class _Moving(threading.local):
    memo: dict | None = None   # during a module conversion: id(old parameter) -> its new one


_MOVING = _Moving()


def _releasing_shadows(apply: Callable) -> Callable:
    """``Module._apply`` (under ``.to``, ``.half()``, ``.cpu()``...) made able to convert
    parameters that have weak references. torch swaps a parameter whose converted value
    is a wrapper subclass (every tpu parameter), and refuses to swap a tensor that has
    weak references. So first the module's own tensors drop their cached shadows (a
    shadow holds the one weak reference to its tensor: without this a model that had run
    compiled could not be moved or cast again); a CPU parameter still weakly referenced
    (an exported program's module holds its parameters in a weak-keyed table) is replaced
    by a new tpu Parameter, as torch does where it cannot convert in place, one per old
    parameter so tied weights stay tied. ``_apply`` recurses into children itself."""
    @functools.wraps(apply)
    def wrapper(self, fn, recurse=True):
        outer = _MOVING.memo is None
        if outer:
            _MOVING.memo = {}
        try:
            for t in itertools.chain(self._parameters.values(), self._buffers.values()):
                if t is not None and weakref.getweakrefcount(t):
                    t.__dict__.pop("_tpu_shadow", None)
                g = t.grad if isinstance(t, torch.nn.Parameter) else None
                if g is not None and weakref.getweakrefcount(g):
                    g.__dict__.pop("_tpu_shadow", None)
            for name, p in self._parameters.items():
                if p is not None and not isinstance(p, TpuTensor) and weakref.getweakrefcount(p):
                    _replace_held(self, name, p, fn)
            if outer and _converts_nothing(self, fn, recurse):
                return self
            return apply(self, fn, recurse)
        finally:
            if outer:
                _MOVING.memo = None
    return wrapper


def _converts_nothing(module: torch.nn.Module, fn: Callable, recurse: bool) -> bool:
    """True when ``fn`` returns every tensor of ``module`` (tpu tensors among them) as it is:
    torch would swap each tpu tensor with itself, and refuse to for one that is weakly
    referenced (Dynamo holds a compiled function's parameters so: "Couldn't swap"), although
    there is nothing to do (SwitchTransformers' router runs ``self.classifier.to(self.dtype)``
    in its forward). A conversion that changes something stops at its first tensor."""
    tensors = [t for m in (module.modules() if recurse else [module])
               for t in itertools.chain(m._parameters.values(), m._buffers.values()) if t is not None]
    if not any(type(t) is TpuTensor for t in tensors):
        return False
    tensors += [t.grad for t in tensors if isinstance(t, torch.nn.Parameter) and t.grad is not None]
    with torch.no_grad():
        return all(fn(t) is t for t in tensors)


def _replace_held(module: torch.nn.Module, name: str, p: torch.nn.Parameter, fn: Callable) -> None:
    """Give ``module`` a new Parameter for ``p`` where ``fn`` makes it a tpu tensor."""
    new = _MOVING.memo.get(id(p))
    if new is None:
        with torch.no_grad():
            value = fn(p)
        if not isinstance(value, TpuTensor):
            return
        new = _MOVING.memo[id(p)] = (torch.nn.Parameter(value, p.requires_grad), p)   # (p: keeps the id)
        if p.grad is not None:
            with torch.no_grad():
                new[0].grad = fn(p.grad)
    module._parameters[name] = new[0]


torch.nn.Module._apply = _releasing_shadows(torch.nn.Module._apply)
