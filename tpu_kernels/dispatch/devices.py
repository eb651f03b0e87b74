"""CPU tensors in a tpu op's arguments: which ones torch lets a CUDA op take, and the
error for the rest. The one rule; the dispatcher asks it only when it meets a CPU tensor.

torch's rules for an accelerator tensor's op (as its CUDA kernels and FakeTensor's device
propagation apply them):

- a 0-dim CPU tensor mixes as a scalar in any op (``x + torch.tensor(2.)``,
  ``x.masked_fill(m, torch.tensor(0.))``, ``index_put_`` of a 0-dim value), except the
  ops that refuse it on CUDA too (``nextafter``);
- the index tensors of advanced indexing may be CPU tensors of any shape
  (``x[cpu_idx]``, ``x[cpu_idx] = v``: ``aten.index.Tensor`` and the ``index_put``
  family); they are copied to the device;
- a ``_foreach_*`` op's ``scalars`` is a CPU tensor list by its contract, and so is
  ``_pack_padded_sequence``'s ``lengths`` (``nn.utils.rnn.pack_padded_sequence``); CTC
  loss's length tensors may be on the CPU (CUDA's kernel reads them there);
- any other CPU tensor (``index_select``/``gather`` indices, a CPU operand of ``mm`` or a
  non-0-dim ``add``) raises torch's "Expected all tensors to be on the same device";
- so do tpu tensors on two tpu devices (``a_tpu0 + b_tpu1``): JAX would quietly move one
  (``same_device``, asked only when the process has several tpu devices).

``tensor_split``'s tensor ``indices_or_sections`` is a CPU tensor by its own contract
(torch raises for a device tensor); its CompositeImplicit kernel reads it before any tpu
op sees it, so no rule is needed here.

And where a result lives when the process has several tpu devices: on the device its
``device`` keyword names (``torch.zeros(2, device="tpu:1")``, ``zeros_like(t,
device="tpu:1")``; ``"tpu"``: the current device), else on its tensor inputs' device,
even an input read for its metadata only (``zeros_like(t)``, ``t.new_ones(2)``,
``randn_like(t)``), as torch's CUDA kernels place them. A program with no placed input
runs on JAX's default device: ``made_on`` makes such a call's result on the named device;
``dispatch/lowering.py`` keeps metadata-only inputs in a program's arguments so that it
runs where they are; an unjitted impl (``nonzero``: its result made from host values)
runs through ``made_on`` its inputs' device (``dispatch/run.py``'s ``run_call``).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import torch
from torch.utils._pytree import tree_leaves

from tpu_kernels import devices
from tpu_kernels.tensor import TpuTensor

aten = torch.ops.aten

# advanced indexing: the `indices` argument may live on the CPU
INDEX_OPS = frozenset({
    aten.index.Tensor, aten._unsafe_index.Tensor, aten.index_put.default, aten.index_put_.default,
    aten._unsafe_index_put.default, aten._index_put_impl_.default,
})
CTC_OPS = frozenset({aten._ctc_loss.Tensor, aten._ctc_loss_backward.Tensor})
# ops whose CUDA kernels refuse a 0-dim CPU tensor (FakeTensor's bypass list)
NO_CPU_SCALAR = frozenset({aten.nextafter.default})


def cpu_arg_allowed(op: Any, name: str, t: torch.Tensor) -> bool:
    """Whether torch lets ``op`` on an accelerator take the CPU tensor ``t`` as its
    argument ``name`` (see the module docstring)."""
    if t.device.type != "cpu":
        return False
    if name == "indices" and op in INDEX_OPS:
        return True
    if name == "scalars" or (name == "lengths" and op is aten._pack_padded_sequence.default):
        return True
    if name in ("input_lengths", "target_lengths") and op in CTC_OPS:
        return True
    return t.dim() == 0 and op not in NO_CPU_SCALAR


def device_error(op: Any, t: torch.Tensor, call: Any = ()) -> RuntimeError:
    """torch's error for a tensor ``t`` on another device than the call's first tpu tensor
    (the device torch's TensorIterator takes as the common one)."""
    first = next((x for x in tree_leaves(call) if isinstance(x, TpuTensor)), None)
    common = first.device if first is not None else torch.device("tpu", 0)
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{common} and {t.device}! (when checking arguments for {op})")


def same_device(op: Any, leaves: list, call: Any) -> int | None:
    """Raise torch's error if the tpu tensors among a call's ``leaves`` are on two devices;
    else their device's index (None: no tpu tensor among them)."""
    index = None
    for v in leaves:
        if isinstance(v, TpuTensor):
            i = v._tpu_storage.index
            if index is None:
                index = i
            elif i != index:
                raise device_error(op, v, call)
    return index


def meta_of_cpu(t: torch.Tensor) -> torch.Tensor:
    """What torch's meta functions see for an accepted CPU tensor. A 0-dim scalar becomes
    a meta tensor, as on CUDA it is used on the device (``masked_fill``'s ref checks that
    ``value`` is on ``a``'s device or is a CPU scalar beside a CUDA ``a``; a meta ``a`` is
    neither). Index tensors and a foreach ``scalars`` list stay on the CPU, as torch's
    meta functions (and FakeTensor) take them."""
    return t.to("meta") if t.dim() == 0 else t


def named_index(kwargs: dict) -> int | None:
    """The tpu device index a call's ``device`` keyword names (``"tpu"``: the current
    device; an index out of range raises torch's error), or None (no tpu device named)."""
    d = kwargs.get("device")
    if d is None or torch.device(d).type != "tpu":
        return None
    return devices.index(d)


def made_on(index: int, make: Callable[[], Any]) -> Any:
    """``make()``'s tpu tensor result, made on tpu ``index``: its program runs with that
    device as JAX's default (a program with no placed input runs there) and the result's
    array is placed there (later ops run where it is; a deferred result's program runs
    where it was recorded)."""
    if index == 0:
        return make()
    dev = devices.jax_device(index)
    with jax.default_device(dev):
        out = make()
    for t in tree_leaves(out):
        st = getattr(t, "_tpu_storage", None)
        if st is not None and isinstance(st.array, jax.Array):
            st.array = jax.device_put(st.array, dev)
    return out

