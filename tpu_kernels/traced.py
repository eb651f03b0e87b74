"""tpu tensors under ``torch.compile``: a traceable wrapper subclass with a shadow inside.

Dynamo and AOTAutograd trace tensor subclasses that say how to take them apart
(``__tensor_flatten__``) and put them back (``__tensor_unflatten__``) in terms of inner
torch tensors. A tpu tensor's data is a jax.Array, not a torch tensor, so its one inner
tensor is a *shadow*: a plain tensor on the tpu device with the outer tensor's sizes,
strides and storage offset over a storage that owns no memory. Shadows of views of one
storage share one such storage, so the compiler sees their aliasing.

While tracing, the shadow is a FakeTensor and the outer tensor is *traced* (it has no
jax storage): every ATen op on it runs on the shadows (torch's meta functions give the
result's metadata) and is recorded by AOTAutograd as an op on plain tpu tensors. At run
time the compiled graph receives shadows of the real tensors; ``array_of`` finds their
values through the owner each shadow points back to.
"""
from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_map

if TYPE_CHECKING:
    from tpu_kernels.tensor import TpuTensor

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_SET = torch.ops.aten.set_.source_Storage_storage_offset
_ADDRESSES = itertools.count(1)


def shadow(t: "TpuTensor") -> torch.Tensor:
    """A memory-less plain tpu tensor with ``t``'s geometry, pointing back to ``t``.

    Kept on ``t`` while its geometry holds: Dynamo tells inputs apart by object identity.
    """
    if t._tpu_storage is None:
        return t._tpu_inner
    st = t._tpu_storage
    key = (id(st), st.numel, t.dtype, tuple(t.shape), t.stride(), t.storage_offset())
    cached = t.__dict__.get("_tpu_shadow_cache")
    if cached is not None and cached[0] == key:
        return cached[1]
    # never empty: torch cannot resize an empty storage of a Python-registered device
    nbytes = max(st.numel, 1) * st.array.dtype.itemsize
    storage = st.shadow
    if storage is None or storage.nbytes() != nbytes:
        # a distinct fake address per storage; nothing ever reads through it
        storage = st.shadow = torch._C._construct_storage_from_data_pointer(
            next(_ADDRESSES) << 24, t.device, nbytes)
    s = torch._C._acc.create_empty_tensor((0,), t.dtype)
    # torch's CPU set_ only rewrites metadata: it never touches the (absent) memory
    _SET.redispatch(_CPU_KEYS, s, storage, t.storage_offset(), t.shape, t.stride())
    s._tpu_owner = weakref.ref(t)   # weak: t keeps its shadow, not the other way round
    t._tpu_shadow_cache = (key, s)
    return s


def unflatten(cls: type, inner: torch.Tensor, size, stride) -> Any:
    """The outer tensor for ``inner``: a real tpu tensor, or a traced one while tracing."""
    if isinstance(inner, cls):          # a compiled graph returned the real tensor
        return inner
    owner = getattr(inner, "_tpu_owner", None)
    if owner is not None and owner() is not None:
        return owner()
    return traced(cls, inner, size, stride)


def traced(cls: type, inner: torch.Tensor, size=None, stride=None) -> "TpuTensor":
    """A traced tpu tensor: the wrapper around a fake shadow, with no jax storage."""
    r = torch.Tensor._make_wrapper_subclass(
        cls, inner.shape if size is None else size,
        strides=inner.stride() if stride is None else stride,
        storage_offset=inner.storage_offset(), dtype=inner.dtype, device=inner.device,
        requires_grad=inner.requires_grad)
    r._tpu_storage = None
    r._tpu_inner = inner
    r._tpu_direct = False
    r._tpu_cache = None
    return r


def is_traced(args: tuple, kwargs: dict, cls: type) -> bool:
    """True when the op's first tpu tensor is a traced one (we are inside a compiler)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            a = next((x for x in a if isinstance(x, cls)), None)
        if isinstance(a, cls):
            return a._tpu_storage is None
    return False


def run(cls: type, func, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on the shadows of traced tpu tensors; wrap its tpu results again."""
    def unwrap(a):
        if not isinstance(a, cls):
            return a
        if a._tpu_storage is None:
            return a._tpu_inner
        raise RuntimeError(
            f"{func}: a tpu tensor that is not an input of the compiled function (shape "
            f"{tuple(a.shape)}, {a.dtype}) was used inside torch.compile(backend='tpu'); "
            f"pass it as an argument or make it a module buffer or parameter")

    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))

    def rewrap(o):
        if isinstance(o, torch.Tensor) and not isinstance(o, cls) and o.device.type == "tpu":
            return traced(cls, o)
        return o

    return return_and_correct_aliasing(func, args, kwargs, tree_map(rewrap, out))


def owner_of(x: torch.Tensor) -> "TpuTensor":
    """The tpu tensor behind a compiled graph's tensor argument (a shadow or itself)."""
    from tpu_kernels.tensor import TpuTensor
    if isinstance(x, TpuTensor):
        return x
    owner = getattr(x, "_tpu_owner", None)
    owner = owner() if owner is not None else None
    if owner is None:
        raise RuntimeError(
            f"a compiled tpu graph got a tensor it cannot read (shape {tuple(x.shape)}, "
            f"{x.dtype}, device {x.device}): only tpu tensors can be its inputs")
    return owner
