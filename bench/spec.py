"""What a benchmark definition declares: the op, its inputs per case, FLOPs and bytes.

The runner (``python -m tpu_kernels bench``) times every implementation the registry
has for ``op`` (plus torch on the CPU) on each case; definitions only describe the work.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from tpu_kernels.registry.opnames import resolve_overload


@dataclasses.dataclass(frozen=True)
class Case:
    """One shape (named dims) and dtype of a benchmark."""
    dims: tuple[tuple[str, int], ...]
    dtype: torch.dtype
    quick: bool = False   # part of the `--quick` set (must be small on a 2-core CPU)

    def __getitem__(self, name: str) -> int:
        return dict(self.dims)[name]

    @property
    def label(self) -> str:
        return "x".join(f"{k}{v}" for k, v in self.dims)


def case(dtype: torch.dtype = torch.float32, quick: bool = False, **dims: int) -> Case:
    """``case(m=128, n=256, k=64, dtype=torch.bfloat16)``."""
    return Case(tuple(dims.items()), dtype, quick)


@dataclasses.dataclass(frozen=True)
class KernelBench:
    """A kernel's benchmark: ``op`` is an op name as the registry spells it
    (``"aten::mm"``, ``"aten::var_mean.correction"``, ``"tpu_kernels::ragged_dot"``)."""
    name: str
    op: str
    make_args: Callable[[Case], tuple[tuple[Any, ...], dict[str, Any]]]  # CPU torch args, kwargs
    flops: Callable[[Case], float]
    bytes: Callable[[Case], float]   # minimal HBM traffic: inputs read + outputs written
    cases: tuple[Case, ...]

    def overload(self) -> Any:
        """The op's ``OpOverload`` (``ValueError`` while it is not defined)."""
        return resolve_overload(self.op)


def nbytes(dtype: torch.dtype, *counts: int) -> int:
    """Bytes of ``sum(counts)`` elements of ``dtype``."""
    return sum(counts) * torch.empty((), dtype=dtype).element_size()
