"""The tpu tensor: a torch wrapper subclass over a shared ``Storage`` holding a jax.Array.

Views share the storage; an in-place op writes into it and bumps its version, so every
view sees the change (reading and writing values: ``tensor_values.py``). Every ATen op
on a tpu tensor reaches ``__torch_dispatch__``, which calls the hook the dispatcher
installs (``install_dispatch``): this layer knows nothing of routing.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import jax
import torch
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_map

from tpu_kernels import errors, printing, shadow, streams, strided
from tpu_kernels.registry.dtypes import to_jax_dtype, to_torch_dtype
from tpu_kernels.storage import Storage, copied as storage_copied, to_torch
from tpu_kernels.tensor_values import read, value

_compiler = torch.compiler
DEVICES = tuple(torch.device("tpu", i) for i in range(64))   # tpu:i, made once

_dispatch: Callable[[Any, tuple, dict], Any] | None = None
_guarded: Callable[[Any, tuple, dict], Any] | None = None
_on_backward_error: Callable[[Any, tuple, dict, Exception], Any] | None = None
# the frame callback Dynamo sets while a compiled function runs (None outside torch.compile)
_frame_callback = torch._C._dynamo.eval_frame.get_eval_frame_callback


def install_dispatch(run: Callable[[Any, tuple, dict], Any], guarded: Callable[[Any, tuple, dict], Any],
                     on_backward_error: Callable[[Any, tuple, dict, Exception], Any]) -> None:
    """The dispatcher's entry (``run(op, args, kwargs)``), the same entry for calls made
    under torch.compile (``guarded``: Dynamo must never trace the runtime), and what to do
    with an error inside torch's autograd engine (backward), where raising would abort the process
    (see errors.py)."""
    global _dispatch, _guarded, _on_backward_error
    _dispatch, _guarded, _on_backward_error = run, guarded, on_backward_error


_TORCH_DATA = torch._C.TensorBase.data     # the C getset TpuTensor.data wraps
_FLATTENED = (["_tpu_shadow"], None)       # __tensor_flatten__'s (inner attributes, context)


class _ShadowSlot:
    """``t._tpu_shadow``: made on first use and kept in ``t.__dict__``, where later reads
    find it without a Python call (Dynamo's guards read it for every tpu input of every
    compiled call); ``repoint``, the one place a tensor's geometry changes, drops it. Its
    identity is kept while the geometry holds: Dynamo tells inputs apart by it."""

    def __get__(self, t: "TpuTensor | None", owner: type | None = None) -> Any:
        if t is None:
            return self
        st = t._tpu_storage
        if st is None:
            return t._tpu_inner
        s = t.__dict__["_tpu_shadow"] = shadow.make_shadow(t, st)
        return s


class TpuTensor(torch.Tensor):
    """A tensor on the ``tpu`` device. Use ``t.jax()`` for its value as a jax.Array."""
    _tpu_storage: Storage | None     # None: a traced tensor (inside torch.compile)
    # the tensor is its storage's whole array, same shape; class defaults (what
    # ``wrap_known``'s results have) spare the hot path two attribute writes
    _tpu_direct: bool = True
    _tpu_cache: tuple[int, jax.Array] | None = None   # a view's value, per storage version
    _tpu_fk: int | None = None   # its geometry's token (``fast_tokens.py``), once asked for

    @staticmethod
    def __new__(cls, storage: Storage, size, stride=None, offset: int = 0,
                dtype: torch.dtype | None = None, requires_grad: bool = False):
        size = tuple(size)
        stride = strided.contiguous_strides(size) if stride is None else tuple(stride)
        dtype = dtype if dtype is not None else to_torch_dtype(storage.array.dtype)
        # never an empty torch storage for an empty tensor: torch.compile would resize it
        extra = {"storage_size": 1} if 0 in size else {}
        r = torch.Tensor._make_wrapper_subclass(
            cls, size, strides=stride, storage_offset=offset, dtype=dtype, device=DEVICES[storage.index],
            requires_grad=requires_grad, **extra)
        r._tpu_storage = storage
        # (a view(dtype) of the whole storage is not direct: its read bit-casts)
        r._tpu_direct = (offset == 0 and size == tuple(storage.array.shape)
                         and stride == strided.contiguous_strides(size) and storage.array.dtype == to_jax_dtype(dtype))
        r._tpu_cache = None
        return r

    @classmethod
    def _traced(cls, inner: torch.Tensor) -> "TpuTensor":
        """A traced tpu tensor: the wrapper around a fake shadow, with no jax storage, and
        the shadow's (symbolic) geometry."""
        r = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(),
            storage_offset=inner.storage_offset(), dtype=inner.dtype, device=inner.device,
            requires_grad=inner.requires_grad)
        r._tpu_storage = None
        r._tpu_inner = inner
        r._tpu_direct = False
        r._tpu_cache = None
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # inside torch.compile's tracing (the scan is skipped on eager's hot path); the flag
        # is what torch.compiler.is_compiling() returns outside TorchScript, two calls less
        if _compiler._is_compiling_flag:
            if _is_traced(args, kwargs):
                try:
                    return _run_on_shadows(func, args, kwargs)
                except Exception as exc:
                    if not errors.in_backward():
                        raise
                    return _traced_backward_error(func, exc)
            if func in _LIFTS:
                return _lift_constant(func, args[0])
            run = _guarded
        else:   # plain eager unless a compiled function runs (its graph breaks call here)
            run = _dispatch if _frame_callback() is None else _guarded
        try:
            return run(func, args, kwargs)
        except Exception as exc:
            if not errors.in_backward():
                raise
            return _on_backward_error(func, args, kwargs, exc)

    # torch.compile takes tpu tensors apart into one memory-less shadow (see shadow.py).
    # Dynamo's guards call this twice per tpu input on every compiled call (the subclass
    # metadata and attribute-list guards): one shared answer, never mutated, allocates
    # nothing (a GPT's guards: 19 -> 15 µs, bench/compile_overhead.py)
    def __tensor_flatten__(self):
        return _FLATTENED

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        inner = inner["_tpu_shadow"]
        if isinstance(inner, TpuTensor):          # a compiled graph returned the real tensor
            return inner
        real = shadow.owner(inner)
        if real is not None:
            return real
        src = shadow.source(inner)                # its tensor is gone: a new one, same view
        if src is not None:
            return TpuTensor(src[0], *src[1])
        # the shadow's own (symbolic) sizes: torch then compares them with ``outer_size``
        # and ``outer_stride``, which equates Dynamo's outer and inner symbols (given the
        # outer ones, nothing ties the two, and a guard on an outer symbol that no input
        # binds failed: 'sources must not be empty for symbol s3', as the hash seed fell)
        return TpuTensor._traced(inner)

    _tpu_shadow = _ShadowSlot()

    # Dynamo makes a fake of a view input by replaying its view chain on a fake of its
    # base; for a subclass, torch 2.13 replays slices with the slice bounds as fresh
    # symbols that a recompile with dynamic shapes cannot bind ("we only expect to bind
    # basic symbols ... s12 + s60": an eager slice of a compiled output fed back in, as
    # XLNet's generate does with its mems). Every tpu view is a strided window of its
    # base's storage, so one as_strided over the base is the whole chain; its sizes are
    # single symbols that torch equates with the view's own.
    @property
    def _view_func_unsafe(self) -> Callable[..., torch.Tensor]:
        return shadow.view_replay(self)

    def __coerce_same_metadata_as_tangent__(self, expected_metadata: Any, expected_type: type | None = None):
        """This tensor as a compiled backward expects a tangent: itself, or (where the trace
        guessed a plain tensor: a mutated input's gradient) its shadow, which the program
        reads as it reads every flattened tpu input."""
        if expected_type is None or expected_type is type(self):
            return self
        if expected_type is torch.Tensor:
            return self._tpu_shadow
        return None

    @property
    def data(self) -> torch.Tensor:  # noqa: D102
        return _TORCH_DATA.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        # torch's setter swaps only the C++ metadata; the jax storage lives on the Python
        # object, so ``p.data = q`` between tpu tensors must repoint it as well
        if isinstance(new, TpuTensor) and new._tpu_storage is not None and self._tpu_storage is not None:
            repoint(self, new)
        else:
            _TORCH_DATA.__set__(self, new)
            self.__dict__.pop("_tpu_fk", None)
            self.__dict__.pop("_tpu_geom", None)

    def jax(self) -> jax.Array:
        """This tensor's value as a jax.Array (a copy-free read where the layout allows)."""
        return value(self)

    def numpy(self, *, force: bool = False):  # noqa: D102
        if force:
            return self.cpu().numpy()
        raise TypeError(
            "can't convert tpu:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
            "tensor to host memory first.")

    def tolist(self):  # noqa: D102  (torch refuses tolist on subclasses)
        return self.cpu().tolist()

    record_stream = streams.record_stream   # (torch's wants a torch.Stream)

    def __repr__(self, *, tensor_contents=None) -> str:
        if self._tpu_storage is None:   # traced by torch.compile: no values yet
            return f"TpuTensor(traced, shape={tuple(self.shape)}, dtype={self.dtype})"
        errors.raise_pending()
        with torch._C.DisableTorchFunctionSubclass():
            text = printing.tensor_repr(self, to_torch(read(self), self.dtype))
        # a tpu parameter is a TpuTensor marked ``_is_param`` (torch's rule for subclasses):
        # printed as torch.nn.Parameter prints itself
        return "Parameter containing:\n" + text if getattr(self, "_is_param", False) else text

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        # torch.Tensor.__format__ formats a 0-dim tensor as its number only when its type is
        # exactly Tensor (so f"expert_{idx}" of a 0-dim CUDA tensor is "expert_3"); the same
        # rule for the tpu subclass
        if self.dim() == 0 and self._tpu_storage is not None:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    # torch's storage of a tpu tensor (``untyped_storage()``) is a memory-less one of its
    # own: torch.compile's fake tensors rely on that. An address is what code written for
    # CUDA compares to find tensors sharing memory (safetensors, transformers' tied
    # weights), so ``data_ptr()`` and ``storage()`` answer with a fake address, one per tpu
    # storage and shared by its views (``shadow.torch_storage``); nothing reads through it.

    def data_ptr(self) -> int:
        """The fake address of its first element: its storage's plus the offset."""
        st = self._tpu_storage
        if st is None:
            return super().data_ptr()
        return shadow.torch_storage(st, self.device).data_ptr() + self.storage_offset() * self.element_size()

    def storage(self) -> torch.TypedStorage:
        """Its tpu storage's memory-less torch storage (fake address, real size)."""
        st = self._tpu_storage
        if st is None:
            return super().storage()
        return torch.TypedStorage(wrap_storage=shadow.torch_storage(st, self.device), dtype=self.dtype,
                                  _internal=True)

    def __deepcopy__(self, memo: dict) -> "TpuTensor":
        """A copy over a copy of its storage, as torch deep-copies a tensor: views copied
        together (``deepcopy((a, a[0]))``, a module's tied or viewed weights) share the new
        storage as they shared the old (the memo maps a storage to its copy)."""
        st = self._tpu_storage
        if id(self) in memo or not self.is_leaf or st is None:
            return super().__deepcopy__(memo)   # memo hit, or torch's error for a non-leaf
        new_st = memo.get(id(st))
        if new_st is None:
            new_st = memo[id(st)] = storage_copied(st)
            memo.setdefault(id(memo), []).append(st)   # deepcopy's rule: keep memo keys alive
        new = TpuTensor(new_st, tuple(self.shape), self.stride(), self.storage_offset(), self.dtype)
        new.requires_grad_(self.requires_grad)
        memo[id(self)] = new
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        for k, v in self.__dict__.items():
            if not k.startswith("_tpu_"):
                setattr(new, k, copy.deepcopy(v, memo))
        return new

    def __reduce_ex__(self, proto):
        """Pickled as (storage, geometry): views of one storage share it again when loaded
        (pickle keeps one copy of the storage); see ``serialization.py`` for map_location."""
        st = self._tpu_storage
        if st is None:
            raise RuntimeError("a tpu tensor traced by torch.compile has no value to save")
        errors.raise_pending()
        return (rebuild_tensor, (st, tuple(self.shape), self.stride(), self.storage_offset(), self.dtype,
                                 self.requires_grad))


def rebuild_tensor(storage: Storage | torch.Tensor, size: tuple, stride: tuple, offset: int,
                   dtype: torch.dtype, requires_grad: bool) -> torch.Tensor:
    """Unpickle a tpu tensor saved by ``__reduce_ex__``; ``storage`` came back as a tpu
    ``Storage``, or, loaded with ``map_location="cpu"``, as a flat CPU tensor."""
    if isinstance(storage, Storage):
        t = TpuTensor(storage, size, stride, offset, dtype)
    else:
        t = storage.view(dtype) if storage.dtype != dtype else storage
        t = t.as_strided(size, stride, offset)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _is_traced(args: tuple, kwargs: dict) -> bool:
    """True when the op's first tpu tensor is a traced one (we are inside a compiler)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            a = next((x for x in a if isinstance(x, TpuTensor)), None)
        if isinstance(a, TpuTensor):
            return a._tpu_storage is None
    return False


_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)


def _lift_constant(func, t: TpuTensor) -> torch.Tensor:
    """``torch.tensor(data, device="tpu")`` inside a compiled function: torch made ``t`` on
    the device and lifts it into the trace. The trace records it as a CPU constant copied
    into a new device tensor (not ``.to``: fake tensors would fold a tiny constant's move
    into a device tensor of their own); the result is traced."""
    cpu = func(to_torch(read(t), t.dtype))
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(cpu)
    return out if isinstance(out, TpuTensor) else TpuTensor._traced(out)


def _traced_backward_error(func, exc: Exception) -> None:
    """An op failed while AOTAutograd traced a backward: kept for the compile to raise
    (``compile_backend``), and an undefined gradient lets the engine finish. Raised through
    torch's C++ autograd node, the error would end the process: the engine restores a tpu
    node's stream while unwinding, through the Python device guard, with the error still
    set (std::terminate)."""
    errors.defer(exc, str(func))


def _run_on_shadows(func, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on the shadows of traced tpu tensors; wrap its tpu results again."""
    def unwrap(a):
        if not isinstance(a, TpuTensor):
            return a
        if a._tpu_storage is None:
            return a._tpu_inner
        raise RuntimeError(
            f"{func}: a tpu tensor that is not an input of the compiled function (shape "
            f"{tuple(a.shape)}, {a.dtype}) was used inside torch.compile(backend='tpu'); "
            f"pass it as an argument or make it a module buffer or parameter")

    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))

    def rewrap(o):
        if isinstance(o, torch.Tensor) and not isinstance(o, TpuTensor) and o.device.type == "tpu":
            return TpuTensor._traced(o)
        return o

    return return_and_correct_aliasing(func, args, kwargs, tree_map(rewrap, out))


def wrap(array: jax.Array, dtype: torch.dtype | None = None) -> TpuTensor:
    """A new tpu tensor owning ``array`` (contiguous)."""
    return TpuTensor(Storage(array), array.shape, None, 0, dtype)


def wrap_known(array: jax.Array, size: tuple, stride: tuple, dtype: torch.dtype, nbytes: int,
               index: int | None = None) -> TpuTensor:
    """``wrap`` for the hot path: ``array`` is known to have shape ``size`` (non-empty),
    contiguous ``stride``, torch dtype ``dtype`` and ``nbytes`` bytes (and, given
    ``index``, to be on tpu ``index``), so nothing is recomputed. ``_tpu_direct`` and
    ``_tpu_cache`` keep their class defaults (True, None): two attribute writes less;
    torch makes the contiguous strides itself (cheaper than parsing ``stride``)."""
    st = Storage(array, index, nbytes)
    r = _new_wrapper(TpuTensor, size, dtype=dtype, device=DEVICES[st.index])
    r._tpu_storage = st
    return r


_new_wrapper = torch.Tensor._make_wrapper_subclass


def wrap_view(storage: Storage, size: tuple, stride: tuple, offset: int, dtype: torch.dtype,
              direct: bool) -> TpuTensor:
    """``TpuTensor(storage, ...)`` for the hot paths, with everything known: ``size`` (not
    empty), ``stride``, ``offset``, ``dtype`` and whether the view is its whole storage
    (``direct``)."""
    r = _new_wrapper(TpuTensor, size, strides=stride, storage_offset=offset, dtype=dtype,
                     device=DEVICES[storage.index])
    r._tpu_storage = storage
    if not direct:      # (the class default is True)
        r._tpu_direct = False
    return r


def wrap_fast(array: jax.Array, size: tuple, dtype: torch.dtype, nbytes: int, index: int,
              token: int) -> TpuTensor:
    """``wrap_known`` for a FAST hit: its result's geometry token is known too."""
    r = _new_wrapper(TpuTensor, size, dtype=dtype, device=DEVICES[index])
    r._tpu_storage = Storage(array, index, nbytes)
    r._tpu_fk = token
    return r


def repoint(t: TpuTensor, new: TpuTensor) -> TpuTensor:
    """Make ``t`` the view ``new`` is (its geometry and storage), in place: every
    reference to ``t`` sees the change, as after torch's in-place metadata ops."""
    with torch.no_grad():
        _TORCH_DATA.__set__(t, new)
    t._tpu_storage = new._tpu_storage
    t._tpu_direct = new._tpu_direct
    t._tpu_cache = None
    d = t.__dict__                      # what was kept of its geometry
    for kept in ("_tpu_shadow", "_tpu_fk", "_tpu_geom"):
        d.pop(kept, None)
    return t
