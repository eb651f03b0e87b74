"""``torch.linalg``'s error checks (``aten._linalg_check_errors``) on tpu.

``solve``, ``cholesky``, ``inv`` and the rest compute an ``info`` code on the device and
then call ``_linalg_check_errors``, which raises ``torch.linalg.LinAlgError`` with torch's
message when a code is not zero. In eager mode it reads the codes at once, a host sync as
torch's CUDA backend does (so a ``try``/``except LinAlgError`` around the call works; the
``_ex`` variants skip the check). Inside compiled and deferred programs it is a
device-side check raised at the next synchronisation (``registry/xla/linalg.py``).
"""
from __future__ import annotations

import numpy as np

from tpu_kernels import errors, lazy
from tpu_kernels.dispatch import graph_trace, run_call
from tpu_kernels.registry import runtime_handler
from tpu_kernels.registry.xla.linalg import linalg_error
from tpu_kernels.tensor_values import value
@runtime_handler("aten::_linalg_check_errors")
def linalg_check_errors(op, args, kwargs):
    if graph_trace.active() is not None or lazy.recording():
        return run_call(op, args, kwargs)
    info, api_name = args[0], args[1]
    is_matrix = kwargs["is_matrix"] if "is_matrix" in kwargs else args[2]
    errors.raise_pending()
    codes = np.asarray(value(info)).reshape(-1)
    failed = np.flatnonzero(codes)
    if failed.size:
        first = int(failed[0])
        exc, message = linalg_error(api_name, int(codes[first]), None if is_matrix else first)
        raise exc(message)
    return None
