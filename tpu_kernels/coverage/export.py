"""The report's TPU column: does each Pallas/Helion impl of an op lower for TPU?

``compile_check`` is the one function that answers for one impl and one input; today it
exports with ``jax.export(platforms=["tpu"])`` (the Pallas -> Mosaic lowering, which
rejects illegal block shapes; Mosaic's own passes only run in a real TPU compile).
"""
from __future__ import annotations

import datetime
from typing import Any, Callable

import jax
import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from tpu_kernels.pallas.export_check import lower_for_tpu
from tpu_kernels.registry import REGISTRY, Impl
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.registry.kinds import KERNEL_KINDS


def compile_check(impl: Impl, args: tuple, kwargs: dict) -> None:
    """Lower ``impl.fn`` for TPU on abstract copies of the args; raise when it does not."""
    leaves, spec = tree_flatten((args, kwargs))
    pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    structs = [jax.ShapeDtypeStruct(tuple(leaves[i].shape), to_jax_dtype(leaves[i].dtype)) for i in pos]

    def f(*arrays):
        full = list(leaves)
        for i, a in zip(pos, arrays):
            full[i] = a
        a, kw = tree_unflatten(full, spec)
        return impl.fn(*a, **kw)

    exported = lower_for_tpu(f, *structs)   # kernels lower to Mosaic for a chip (compile_for)
    if "tpu_custom_call" not in exported.mlir_module():
        raise RuntimeError("lowered, but no Mosaic kernel (tpu_custom_call) in the module: "
                           "the kernel did not take its TPU path")


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def export_check(op: Any, inputs: list[tuple[tuple, dict, str]],
                 progress: Callable[[str], None]) -> dict[str, dict]:
    """Per kernel impl of ``op``: lowered for TPU ("ok"), failed ("fail", reason) or "n/a",
    on the first of ``inputs`` (args, kwargs, label) the impl accepts."""
    results: dict[str, dict] = {}
    today = datetime.datetime.now().isoformat(timespec="seconds")
    for impl in REGISTRY.impls(op):
        if impl.kind not in KERNEL_KINDS:
            continue
        label = f"{impl.kind}:{impl.name}"
        progress(f"coverage: export check {op} {label}")
        res = {"status": "n/a", "reason": "no input the kernel accepts", "date": today}
        for a, kw, desc in inputs:
            if impl.check(*tree_map(_meta, a), **tree_map(_meta, kw)) is not None:
                continue
            try:
                compile_check(impl, a, kw)
                res = {"status": "ok", "input": desc, "date": today}
            except Exception as exc:  # noqa: BLE001
                res = {"status": "fail", "input": desc, "reason": f"{type(exc).__name__}: {exc}"[:300],
                       "date": today}
            break
        results[label] = res
    return results
