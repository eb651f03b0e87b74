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
time the compiled graph receives shadows of the real tensors; ``source`` gives the
storage and geometry each shadow stands for. A shadow holds its storage strongly: AOTAutograd
keeps shadows whose tpu tensor is gone (activations saved for backward, gradients flattened
from eager code), and they must still be readable.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable

import torch

from tpu_kernels.storage import Storage

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_SET = torch.ops.aten.set_.source_Storage_storage_offset
_SET_BOXED = _SET._handle.redispatch_boxed   # (OpOverload.redispatch without its frame)
_ADDRESSES = itertools.count(1)


def torch_storage(st: Storage, device: torch.device) -> torch.UntypedStorage:
    """The memory-less torch storage standing for ``st``: a distinct fake address per
    storage (nothing ever reads through it), the size of its array. Shadows are made over
    it, and a tpu tensor's ``untyped_storage()`` is it (as on CUDA, views share it)."""
    # never empty: torch cannot resize an empty storage of a Python-registered device
    nbytes = max(st.numel, 1) * st.array.dtype.itemsize
    storage = st.shadow
    if storage is None or storage.nbytes() != nbytes:
        storage = st.shadow = torch._C._construct_storage_from_data_pointer(
            next(_ADDRESSES) << 24, device, nbytes)
    return storage


def geometry(t: torch.Tensor) -> tuple:
    """(sizes, strides, offset, dtype): the view geometry a compiled program is keyed on."""
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype


def make_shadow(t: torch.Tensor, st: Storage) -> torch.Tensor:
    """A memory-less plain tpu tensor with ``t``'s geometry over ``st``'s shadow storage,
    pointing back to ``t``. (Hot: Dynamo's guards on a compiled optimizer step make one
    for each new gradient, every step.)"""
    if st.index:
        raise _not_on_tpu0(t)
    g = geometry(t)
    storage = torch_storage(st, t.device)
    s = torch._C._acc.create_empty_tensor((0,), g[3])
    # torch's CPU set_ only rewrites metadata: it never touches the (absent) memory
    _SET_BOXED(_CPU_KEYS, s, storage, g[2], g[0], g[1])
    s._tpu_owner = weakref.ref(t)   # weak: t keeps its shadow, not the other way round
    # strong: no cycle (the storage holds only the torch storage, not the shadow)
    s._tpu_source = (st, g)
    return s


def _not_on_tpu0(t: torch.Tensor) -> NotImplementedError:
    """torch.compile of a tensor on tpu:1 and above. torch's API for a Python backend
    makes plain tensors of its device on index 0 only (``_acc.create_empty_tensor``), and
    ``set_`` refuses a storage of another device, so a shadow cannot be made there."""
    return NotImplementedError(
        f"torch.compile(backend='tpu') got a tensor on {t.device} (shape {tuple(t.shape)}, {t.dtype}): "
        "compiled functions run on tpu:0 only (eager, deferred mode, torch.tpu.graph and the "
        "optimizers run on every device). Move the model and its inputs to tpu:0, or use one "
        "process per device (torchrun) or tpu_kernels.spmd for several devices.")


def owner(shadow: torch.Tensor) -> Any:
    """The live tpu tensor ``shadow`` stands for, or None (never a fake shadow's)."""
    if type(shadow) is not torch.Tensor:     # a FakeTensor copies the real one's attributes
        return None
    ref = getattr(shadow, "_tpu_owner", None)
    return ref() if ref is not None else None


def source(shadow: torch.Tensor) -> tuple[Storage, tuple] | None:
    """(storage, (sizes, strides, offset, dtype)) that a real shadow stands for, or None."""
    if type(shadow) is not torch.Tensor:
        return None
    return getattr(shadow, "_tpu_source", None)


def view_replay(view: torch.Tensor) -> Callable[..., torch.Tensor]:
    """How to remake ``view`` over a new base (a tensor like its base, e.g. its fake):
    ``replay(new_base, symint_visitor_fn=None, tensor_visitor_fn=None)``, one
    ``as_strided`` with ``view``'s geometry, each int passed through the visitor (Dynamo's
    fakification turns them into symbols it then equates with the view's own). It closes
    over the geometry only: Dynamo's trace log prints it, and must not print the tensor."""
    sizes, strides, offset, _ = geometry(view)

    def replay(new_base: torch.Tensor, symint_visitor_fn: Callable[[int], Any] | None = None,
               tensor_visitor_fn: Any = None) -> torch.Tensor:
        visit = symint_visitor_fn or (lambda n: n)
        return new_base.as_strided([visit(n) for n in sizes], [visit(n) for n in strides], visit(offset))
    return replay


def trace_device_copies() -> None:
    """A small CPU constant moved to tpu inside a compiled function (``torch.tensor(4).to(
    x.device)``, as transformers' sliding-window caches do) stays a traced copy. Fake
    tensors fold such a move by running it for real and keeping the result as a constant;
    here the result is a tpu tensor (a wrapper subclass), which they cannot keep, so Dynamo
    raised 'fake_tensor must be a FakeTensor with a constant'. Refused as a constant, the
    move is traced like any other (torch's path for results it cannot keep). Installed with
    the package, not the backend: Dynamo traces tpu tensors for any backend
    (``torch._dynamo.explain`` uses its own)."""
    from torch._subclasses.fake_tensor import FakeTensorMode   # loaded with torch
    keeps = FakeTensorMode.may_turn_const
    if getattr(keeps, "_tpu_kernels", False):
        return

    def may_turn_const(self, t: torch.Tensor) -> bool:
        return t.device.type != "tpu" and keeps(self, t)
    may_turn_const._tpu_kernels = True
    FakeTensorMode.may_turn_const = may_turn_const
