"""The cost model's table as a picture: per (kernel, shape class or case) and chip, XLA's
estimate over the kernel's modelled time (green: the kernel wins), and the share of the
roofline each reaches (the op's ideal time over the kernel's modelled and over XLA's
estimated time). Written by ``python -m tpu_kernels costs --plot`` and
``bench --cost-model`` (``cost_model.png`` in the plots directory)."""
from __future__ import annotations

import math
import os
from typing import Sequence

_MAX_LOG2 = 3.0     # colour scale of the ratio: 1/8x .. 8x


def _grid(rows: Sequence, value) -> tuple[list[str], list[str], list[list[float]]]:
    """(row labels, chips, values[label][chip]) with NaN where a row is missing or refused."""
    labels = list(dict.fromkeys(f"{r.kernel} {r.shape_class}" for r in rows))
    chips = list(dict.fromkeys(r.chip for r in rows))
    grid = [[math.nan] * len(chips) for _ in labels]
    for r in rows:
        v = value(r)
        if v is not None:
            grid[labels.index(f"{r.kernel} {r.shape_class}")][chips.index(r.chip)] = v
    return labels, chips, grid


def _ratio(r) -> float | None:
    return None if r.decision is None else r.decision.ratio


def _xla_roofline(r) -> float | None:
    d = r.decision
    return None if d is None or not d.xla_seconds else d.useful_seconds / d.xla_seconds


def plot(rows: Sequence, path: str, title: str = "") -> str | None:
    """Write the PNG at ``path`` (rows: ``aot.cost_table.Row``); None when nothing is modelled."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels, chips, ratio = _grid(rows, _ratio)
    if not labels or all(math.isnan(v) for line in ratio for v in line):
        return None
    _, _, kroof = _grid(rows, lambda r: r.roofline_fraction)
    _, _, xroof = _grid(rows, _xla_roofline)
    height = max(3.0, 0.22 * len(labels) + 1.5)
    fig, axes = plt.subplots(1, 3, figsize=(6 + 2.2 * len(chips), height),
                             gridspec_kw={"width_ratios": [1.2, 1, 1]}, sharey=True)
    panels = ((axes[0], ratio, "XLA / kernel (> 1: kernel wins)", "RdYlGn", True),
              (axes[1], kroof, "kernel: share of roofline", "viridis", False),
              (axes[2], xroof, "XLA: share of roofline", "viridis", False))
    for ax, grid, name, cmap, is_ratio in panels:
        data = np.array(grid, dtype=float)
        shown = np.clip(np.log2(data), -_MAX_LOG2, _MAX_LOG2) if is_ratio else np.clip(data, 0, 1)
        ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, aspect="auto",
                  vmin=-_MAX_LOG2 if is_ratio else 0, vmax=_MAX_LOG2 if is_ratio else 1)
        for i, line in enumerate(grid):
            for j, v in enumerate(line):
                text = "-" if math.isnan(v) else (f"{v:.2f}" if is_ratio else f"{v:.0%}")
                ax.text(j, i, text, ha="center", va="center", fontsize=6)
        ax.set_xticks(range(len(chips)))
        ax.set_xticklabels(chips, fontsize=8)
        ax.set_title(name, fontsize=9)
    axes[0].set_yticks(range(len(labels)))
    axes[0].set_yticklabels(labels, fontsize=6)
    fig.suptitle(title or "cost model: kernel (modelled) vs XLA (real compiler's estimate) per chip", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / height))     # room for the title
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
