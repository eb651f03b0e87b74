"""``make_fx`` of functions that close over real tpu tensors (``torch.func.linearize``
traces its forward-AD function so, a user's ``make_fx(f)(x)`` with tpu ``x``).

make_fx's proxy mode handles plain tensors only: given an op with a tpu tensor it has no
proxy for (a constant: a weight the function closes over, linearize's primal), it hands
the op to the tensor's ``__torch_dispatch__`` with the mode still active, which then
recorded the runtime's own meta computations and ran the real op unseen. linearize's
jvp_fn then returned zeros (its graph held the tangent's first value as a constant).

Here a real tpu tensor (one with a storage, outside torch.compile's fake trace) is a
type the proxy mode handles for that call: the op goes into the graph with the tensor as
a constant, as a CPU tensor would. Traced tpu tensors (torch.compile) keep torch's path,
where ``__torch_dispatch__`` runs the op on their shadows.

The same call is where an op on plain fake tensors fails while AOTAutograd traces a tpu
graph's backward (``nonzero`` for the gradient of ``h[mask] = v`` with a constant CPU
mask, wav2vec2's SpecAugment): raised there, the error crosses torch's autograd engine,
which then ends the process (std::terminate, tensor.py's ``_traced_backward_error``). It
is kept instead, for the ``tpu`` backend to raise once the trace is over.
"""
from __future__ import annotations

import threading
from typing import Any

import torch
from torch.fx.experimental import proxy_tensor
from torch.utils._pytree import tree_leaves

from tpu_kernels import errors
from tpu_kernels.tensor import TpuTensor

_PROXY_CALL = proxy_tensor.proxy_call
_FAKE = torch._C._TorchDispatchModeKey.FAKE
_LOCK = threading.RLock()


def _real_tpu(args: Any, kwargs: Any) -> bool:
    """Some argument is a real tpu tensor, and none is traced."""
    found = False
    for t in tree_leaves((args, kwargs)):
        if isinstance(t, TpuTensor):
            if t._tpu_storage is None:
                return False
            found = True
    return found


def proxy_call(proxy_mode: Any, func: Any, pre_dispatch: bool, args: tuple, kwargs: dict) -> Any:
    if (torch.compiler.is_compiling() or torch._C._get_dispatch_mode(_FAKE) is not None
            or not _real_tpu(args, kwargs)):
        if not errors.keeps_traced_backward_errors():
            return _PROXY_CALL(proxy_mode, func, pre_dispatch, args, kwargs)
        try:
            return _PROXY_CALL(proxy_mode, func, pre_dispatch, args, kwargs)
        except Exception as exc:   # kept for the backend to raise; an undefined result
            errors.defer(exc, str(func))   # lets the engine finish (tensor.py's reason)
            return None
    with _LOCK:
        before = proxy_tensor.HANDLED_TYPES
        proxy_tensor.HANDLED_TYPES = (*before, TpuTensor)
        try:
            return _PROXY_CALL(proxy_mode, func, pre_dispatch, args, kwargs)
        finally:
            proxy_tensor.HANDLED_TYPES = before


proxy_tensor.proxy_call = proxy_call
