"""``bench --cost-model``: per kernel, case and chip, the cost model's figures next to the
timings: the kernel's modelled time, XLA's estimate for the op's lowering (the real TPU
compiler's, ``python -m tpu_kernels costs``), their ratio (XLA / kernel: > 1 where the
kernel wins) and the kernel's fraction of the roofline (the op's ideal time over the
kernel's modelled time). No TPU is needed: kernels are traced for each chip."""
from __future__ import annotations

from typing import Iterable

import torch
from torch.utils._pytree import tree_map

from tpu_kernels.aot import cost_table
from tpu_kernels.bench.spec import Case, KernelBench


def _meta(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def rows(pairs: Iterable[tuple[KernelBench, Case]], chips: Iterable[str]) -> list[cost_table.Row]:
    """The cost table's rows for each benchmark case (labelled ``kernel case dtype``)."""
    out: list[cost_table.Row] = []
    for bench, c in pairs:
        try:
            bench.overload()
        except ValueError:           # a definition ahead of its op: nothing to model
            continue
        args, kwargs = bench.make_args(c)
        label = f"{bench.name} {c.label} {str(c.dtype).replace('torch.', '')}"
        out += cost_table.case_rows(bench.op, tree_map(_meta, args), tree_map(_meta, kwargs), label, chips)
    return out


def lines(table_rows: list[cost_table.Row]) -> list[str]:
    """The cost model's table (markdown) and the kernels that win in no row."""
    if not table_rows:
        return []
    never = cost_table.never_win(table_rows)
    return ["", "cost model per chip (kernel modelled, XLA estimated; no TPU timing):",
            cost_table.markdown(table_rows),
            f"kernels that win in no case here: {', '.join(never) or 'none'}"]
