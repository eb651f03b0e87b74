"""Copies between the host and the tpu device, and ``.item()``: the points where a value
leaves the device (device-side errors are raised first, as CUDA raises its asserts)."""
from __future__ import annotations

import jax
import torch

from tpu_kernels import devices, errors, strided
from tpu_kernels.dispatch import graph_trace, meta_args, run_call
from tpu_kernels.dispatch.results import laid_out
from tpu_kernels.registry import runtime_handler
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.storage import Storage, to_jax, to_torch
from tpu_kernels.tensor import TpuTensor
from tpu_kernels.tensor_values import read, value, write
@runtime_handler("aten::item")   # whole under inference mode
# torch.tensor([t[0], t[1]]) reads each element below the Python key: the device's kernel
@runtime_handler("aten::_local_scalar_dense", catch_at="PrivateUse1")
def local_scalar_dense(op, args, kwargs):
    errors.raise_pending()
    return value(args[0]).item()


@runtime_handler("aten::_to_copy")
def to_copy(op, args, kwargs):
    """``t.to("cpu")`` copies to the host here; anything else (dtype casts on the device)
    runs the registered ``_to_copy`` impl. Inside a compiled graph's program every value,
    a CPU tensor's too, is a tpu tensor over the trace: the copy stays one there, and the
    program gives torch the graph's CPU outputs on the CPU once it has run."""
    x = args[0]
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "meta":
        # no data moves: torch's meta kernel on a stand-in of x's geometry (forward AD's
        # zero tangents ask it, `mul(dual, 3)`; so does `copy.deepcopy(model).to("meta")`)
        margs, mkwargs = meta_args(args, kwargs)
        return op(*margs, **mkwargs)
    to_cpu = device is not None and torch.device(device).type == "cpu"
    if to_cpu and graph_trace.active() is None:
        errors.raise_pending()
        out = _host_layout(to_torch(read(x), x.dtype), x, kwargs.get("memory_format"))
        dtype = kwargs.get("dtype")
        return out.to(dtype) if dtype is not None and dtype != out.dtype else out
    kwargs = {k: v for k, v in kwargs.items() if k != "device"}
    out = laid_out(run_call(op, args, kwargs), x, kwargs.get("memory_format"))
    if device is not None and not to_cpu and devices.index(device) != x._tpu_storage.index:   # tpu:i -> tpu:j
        i = devices.index(device)
        out = TpuTensor(Storage(jax.device_put(read(out), devices.jax_device(i)), i), out.shape, None, 0, out.dtype)
    return out


def _host_layout(out: torch.Tensor, x: torch.Tensor, fmt: torch.memory_format | None) -> torch.Tensor:
    """The host copy ``out`` (contiguous) laid out as torch lays out ``_to_copy``'s result:
    a dense tensor keeps its strides under ``preserve_format`` (``x.t().cpu()``, a
    channels_last activation's ``.cpu()``, as from CUDA), another format is taken as asked."""
    if fmt is not None and fmt is not torch.preserve_format:
        return out.contiguous(memory_format=fmt)
    if x.is_contiguous() or strided.memory_order(tuple(x.shape), x.stride()) is None:
        return out
    return torch.empty_strided(x.shape, x.stride(), dtype=out.dtype).copy_(out)


@runtime_handler("aten::clone")
def clone(op, args, kwargs):
    """``x.contiguous(memory_format=torch.channels_last)`` (a clone) lays its result out so."""
    return laid_out(run_call(op, args, kwargs), args[0], kwargs.get("memory_format"))


@runtime_handler("aten::copy_")
def copy_(op, args, kwargs):
    """Copies crossing the host boundary run here; tpu -> tpu runs the registered impl."""
    dst, src = args[0], args[1]
    if not isinstance(dst, TpuTensor):        # tpu -> cpu
        errors.raise_pending()
        dst.copy_(to_torch(read(src), src.dtype))
        return dst
    if not isinstance(src, TpuTensor):        # cpu -> tpu
        return copy_into(dst, src)
    i = dst._tpu_storage.index
    if src._tpu_storage.index != i:           # tpu:j -> tpu:i
        return _write_cast(dst, jax.device_put(value(src), devices.jax_device(i)), src.dtype)
    return run_call(op, args, kwargs)


@runtime_handler("aten::_copy_from", catch_at="PrivateUse1")
def copy_from(op, args, kwargs):
    """CPU -> tpu copies torch routes through ``_copy_from`` (e.g. list indices); not
    ``dst.copy_``: torch would route it back here."""
    return copy_into(args[1], args[0])


def copy_into(dst: TpuTensor, src: torch.Tensor) -> TpuTensor:
    """Copy a CPU tensor into a tpu tensor (broadcast, cast), in place."""
    return _write_cast(dst, to_jax(src, dst._tpu_storage.index), src.dtype)


def _write_cast(dst: TpuTensor, new: jax.Array, dtype: torch.dtype) -> TpuTensor:
    """Write ``new`` (of torch dtype ``dtype``, on ``dst``'s device) into ``dst``, cast."""
    write(dst, new.astype(to_jax_dtype(dst.dtype)) if dtype != dst.dtype else new)
    return dst
