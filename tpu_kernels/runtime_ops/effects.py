"""Ops with side effects inside compiled graphs: the ``with_effects`` higher-order op.

AOTAutograd keeps an op that torch marks effectful (``aten._linalg_check_errors``, which
``torch.linalg.solve``, ``cholesky`` and ``inv`` call to raise on a singular input;
custom ops declared with side effects) in order by threading a *token* through it:
``with_effects(token, op, *args)`` runs ``op`` and returns a new token first. At run time
AOTAutograd passes ``None`` for each token input and drops the token outputs
(``graph_inputs.source_of`` gives a ``None`` argument an empty array). Inside a compiled
program the op runs as every op does (its checks become device-side flags) and the new
token is an empty tpu tensor.
"""
from __future__ import annotations

from typing import Any

import torch
from torch._higher_order_ops.effects import with_effects

from tpu_kernels.tensor import TpuTensor


def _with_effects_rule(token: TpuTensor, op: Any, *args: Any, **kwargs: Any) -> tuple:
    out = op(*args, **kwargs)
    new = torch.empty(0, device=token.device)
    # a tuple result is spread after the token (a list is one result), as torch's dense rule
    return (new, *out) if isinstance(out, tuple) else (new, out)


with_effects.py_impl(TpuTensor)(_with_effects_rule)
