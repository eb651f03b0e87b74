"""The bench's correctness check: a tpu impl's outputs against torch on the CPU, with the
kernel tolerances of the one table (``tpu_kernels.testing.TOLERANCES``)."""
from __future__ import annotations

import torch

from tpu_kernels.testing import tol


def check_outputs(got: list[torch.Tensor], ref: list[torch.Tensor], dtype: torch.dtype) -> dict:
    """``got`` against the CPU reference with the kernel tolerances of ``dtype`` (the one
    table, ``testing.TOLERANCES``), each output's error measured against its largest
    value: ok when ``max|got - ref| <= atol + rtol * max|ref|``. ``rel_err`` is the worst
    ``max|got - ref| / max|ref|``."""
    t = tol(dtype, kernel=True)
    err = _rel_err(got, ref, t)
    if isinstance(err, str):
        return {"ok": False, "note": err}
    rel, ok = err
    return {"ok": ok, "rel_err": rel, "atol": t["atol"], "rtol": t["rtol"]}


def _rel_err(got: list[torch.Tensor], ref: list[torch.Tensor], t: dict) -> tuple[float, bool] | str:
    if len(got) != len(ref):
        return f"{len(got)} outputs, expected {len(ref)}"
    worst, ok = 0.0, True
    # integer outputs next to float ones are indices (topk, max.dim): ties may pick other
    # indices legitimately, so only the float outputs are judged then
    any_float = any(r.is_floating_point() for r in ref)
    for g, r in zip(got, ref):
        if any_float and not r.is_floating_point():
            continue
        g = g.detach().cpu()
        if tuple(g.shape) != tuple(r.shape):
            return f"shape {tuple(g.shape)} != {tuple(r.shape)}"
        if g.numel() == 0:
            continue
        if not r.is_floating_point():
            differ = bool((g != r).any())
            worst, ok = max(worst, float(differ)), ok and not differ
            continue
        g, r = g.double(), r.double()
        finite = torch.isfinite(r)
        if not torch.equal(finite, torch.isfinite(g)):
            return "non-finite values differ"
        if finite.any():
            scale = r[finite].abs().max().item()
            diff = (g[finite] - r[finite]).abs().max().item()
            worst = max(worst, diff / (scale or 1.0))
            ok = ok and diff <= t["atol"] + t["rtol"] * scale
    return worst, ok
