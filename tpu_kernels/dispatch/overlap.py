"""torch's memory-overlap checks of the tensors an op writes (ATen's ``MemOverlap``).

CPU and CUDA refuse to write through a tensor where two elements share one memory place
(``x.expand(3, 4).add_(1)``), or from an input that partly overlaps the written tensor
(``x[1:].copy_(x[:-1])``, ``x.add_(x.t())``): the result would depend on the order the
kernel visits elements. The tpu device computes functionally and would return some answer;
it raises torch's errors instead, for the ops torch checks (its TensorIterator ops:
pointwise ones, copies, random fills, scatters and index writes).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch
from torch._ops import OpOverload

from tpu_kernels import strided
from tpu_kernels.tensor import TpuTensor

aten = torch.ops.aten

INTERNAL = ("unsupported operation: more than one element of the written-to tensor refers to a "
            "single memory location. Please clone() the tensor before performing the operation.")
PARTIAL = ("unsupported operation: some elements of the input tensor and the written-to tensor "
           "refer to a single memory location. Please clone() the tensor before performing the "
           "operation.")

# torch's checked ops that are not tagged pointwise (base names; every overload, in place or out=)
_CHECKED_NAMES = frozenset({
    "copy_", "index_add", "index_add_", "index_copy", "index_copy_", "scatter", "scatter_",
    "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_", "index_reduce",
    "index_reduce_", "put_", "cumsum", "cumsum_", "cumprod", "cumprod_", "renorm", "renorm_",
    "addr", "addr_", "cat", "where", "gather", "index_select", "sort",
})
_TAGS = (torch.Tag.pointwise, torch.Tag.nondeterministic_seeded)
_CHECKED: dict[int, bool] = {}   # id(op) -> checked (OpOverload hashes in Python: slow)


class _Local(threading.local):
    skip = False   # inside ``unchecked()``


_LOCAL = _Local()


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """No checks for the copies inside: an ``out=`` overload checks its own op's rule (a
    reduction's ``out`` may be expanded: torch lets ``sum(x, 1, out=expanded)`` through)."""
    old, _LOCAL.skip = _LOCAL.skip, True
    try:
        yield
    finally:
        _LOCAL.skip = old


def checked(op: OpOverload) -> bool:
    """Whether torch checks the overlap of what ``op`` writes (worked out once per op)."""
    found = _CHECKED.get(id(op))
    if found is None:
        found = _CHECKED[id(op)] = (op.name().split("::")[-1].split(".")[0] in _CHECKED_NAMES
                                    or any(t in op.tags for t in _TAGS))
    return found


def check_written(op: OpOverload, target: Any, args: tuple, kwargs: dict) -> None:
    """Raise torch's error when ``op`` writes ``target`` (a tpu tensor) through an element
    that is also another's, or from an input partly overlapping it."""
    if type(target) is not TpuTensor:
        return
    st = target._tpu_storage
    if st is None or _LOCAL.skip:   # (a traced tensor has no storage)
        return
    found = _CHECKED.get(id(op))
    if not (checked(op) if found is None else found):
        return
    if not target._tpu_direct and _internal_overlap(target):
        raise RuntimeError(INTERNAL)
    for a in (*args, *kwargs.values()) if kwargs else args:
        if type(a) is TpuTensor:
            if a._tpu_storage is st and a is not target and _partial_overlap(target, a):
                raise RuntimeError(PARTIAL)
        elif type(a) is list or type(a) is tuple:   # (cat's inputs)
            for x in a:
                if type(x) is TpuTensor and x._tpu_storage is st and _partial_overlap(target, x):
                    raise RuntimeError(PARTIAL)


def _internal_overlap(t: torch.Tensor) -> bool:
    """ATen's has_internal_overlap == Yes: a dim of stride 0 repeats elements (an empty
    tensor repeats none)."""
    return any(n > 1 and s == 0 for n, s in zip(t.shape, t.stride())) and t.numel() > 0


def _dense(t: torch.Tensor) -> bool:
    """ATen's is_non_overlapping_and_dense (of a non-empty tensor): no gaps, no repeats."""
    return strided.memory_order(tuple(t.shape), t.stride()) is not None


def _partial_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """ATen's get_overlap_status(a, b) == Partial for two tensors of one storage."""
    if a.numel() == 0 or b.numel() == 0 or not _dense(a) or not _dense(b):
        return False   # (not dense: "too hard" to tell, torch lets it through)
    a0, b0 = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    a1, b1 = a0 + a.numel() * a.element_size(), b0 + b.numel() * b.element_size()
    if (a0, a1) == (b0, b1):
        return a.stride() != b.stride()
    return a0 < b1 and b0 < a1
