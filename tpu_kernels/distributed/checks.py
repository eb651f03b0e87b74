"""Do all ranks agree on a collective's arguments? Checked before it runs.

JAX's CPU collectives abort the whole process when ranks disagree on a collective's size
(gloo's "Received data size doesn't match expected size"), and a TPU program would hang.
So before each collective every rank contributes a small fixed-size signature (a digest of
the collective, its parameters and its tensors' shapes and dtypes, plus the first tensor's
shape in clear, plus per-rank integers such as all_to_all split sizes), the signatures are
gathered by a tiny program that is the same on every rank, and a disagreement raises an
error naming the collective, the ranks and their shapes. ``TPU_KERNELS_DIST_CHECKS=0``
skips this (one small collective and a host sync per collective).
"""
from __future__ import annotations

import hashlib
import os
from typing import Sequence

import numpy as np
import torch

from tpu_kernels.distributed import work
from tpu_kernels.distributed.groups import Group

ENABLED = os.environ.get("TPU_KERNELS_DIST_CHECKS", "1") not in ("", "0")
_DIMS = 8
_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64,
           torch.complex128]


class ArgumentMismatch(ValueError):
    """Ranks called a collective with different arguments."""


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")


def _shape_text(row: np.ndarray) -> str:
    code, ndim = int(row[1]), int(row[2])
    dtype = str(_DTYPES[code]).removeprefix("torch.") if 0 <= code < len(_DTYPES) else "?"
    dims = [int(d) for d in row[3:3 + min(ndim, _DIMS)]]
    return f"{dtype}{dims}{'...' if ndim > _DIMS else ''}"


def signature(name: str, params: tuple, tensors: Sequence[torch.Tensor], group: Group,
              extra: Sequence[int] = ()) -> np.ndarray:
    """This rank's signature row: digest, first tensor's dtype and shape, ``extra``."""
    shapes = [(str(t.dtype), tuple(t.shape)) for t in tensors]
    row = np.zeros(3 + _DIMS + 2 * group.size, np.int64)
    row[0] = _digest(repr((name, params, shapes)))
    if tensors:
        t = tensors[0]
        row[1] = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1
        row[2] = t.dim()
        row[3:3 + min(t.dim(), _DIMS)] = list(t.shape)[:_DIMS]
    row[3 + _DIMS:3 + _DIMS + len(extra)] = list(extra)
    return row


def agree(name: str, params: tuple, tensors: Sequence[torch.Tensor], group: Group,
          extra: Sequence[int] = ()) -> np.ndarray | None:
    """Raise ``ArgumentMismatch`` unless every rank of ``group`` passed the same signature;
    returns every rank's ``extra`` integers (``[k, 2k]``; ``None`` when checks are off)."""
    if not ENABLED and not extra:
        return None
    row = signature(name, params, tensors, group, extra)
    gathered = work.run(name, group, "all_gather", row)
    work.wait_ready([gathered], name, group)
    rows = np.asarray(gathered)
    bad = [i for i in range(group.size) if rows[i, 0] != rows[0, 0]]
    if ENABLED and bad:
        described = ", ".join(f"rank {group.ranks[i]}: {_shape_text(rows[i])}" for i in [0] + bad)
        raise ArgumentMismatch(
            f"tpu {name} over ranks {list(group.ranks)}: the ranks called it with different "
            f"arguments ({described}; shapes, dtypes, the reduce op, root, split sizes or the "
            f"collective itself differ). Every rank must pass tensors of the same shape and "
            f"dtype and the same parameters to a collective")
    return rows[:, 3 + _DIMS:]
