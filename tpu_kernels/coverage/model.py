"""Which ATen ops does a model need, and which of them run on tpu (and by what)?

    from tpu_kernels import coverage
    report = coverage.model_ops(model, tokens)          # forward + backward, traced on CPU
    report = coverage.model_ops(hf_model, **batch)      # keyword inputs (transformers models)
    report["missing"]                                   # the ops it needs that no tpu impl runs

The model runs once on the CPU (or the meta device) under a ``TorchDispatchMode`` that
records every ATen overload that reaches the dispatcher, forward and backward; each
recorded op is then classified against the live registry (``coverage.classify``) and the
route is asked which impl runs for the recorded arguments. An op is missing when
nothing runs it on tpu: the route refuses it (no impl, twin or decomposition), or every
impl refuses the model's arguments (the row's ``note`` gives each impl's reason).
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from tpu_kernels.coverage.targets import classify, load_targets
from tpu_kernels.registry import route


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        try:
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        except Exception:  # noqa: BLE001  (sparse, nested...)
            return torch.empty(x.shape, dtype=x.dtype, device="meta")
    return x


class OpRecorder(TorchDispatchMode):
    """Records ``(op overload, phase) -> calls`` and the meta arguments of each op's first call."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "forward"
        self.calls: dict[tuple[Any, str], int] = {}
        self.first_args: dict[Any, tuple[tuple, dict]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = (func, self.phase)
        self.calls[key] = self.calls.get(key, 0) + 1
        if func not in self.first_args:
            try:
                self.first_args[func] = (tree_map(_meta, args), tree_map(_meta, kwargs))
            except Exception:  # noqa: BLE001
                pass
        return func(*args, **kwargs)


def _loss_of(out: Any) -> torch.Tensor | None:
    leaves = [t for t in tree_flatten(out)[0]
              if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
    if not leaves:
        return None
    return sum(t.float().sum() for t in leaves)


def trace(model: Any, *example_inputs: Any, backward: bool = True, **example_kwargs: Any) -> OpRecorder:
    """Run ``model(*example_inputs, **example_kwargs)`` (and backward of the sum of its
    float outputs) recording ops."""
    rec = OpRecorder()
    with rec:
        out = model(*example_inputs, **example_kwargs)
    if backward:
        loss = _loss_of(out)
        if loss is not None:
            rec.phase = "backward"
            with rec:
                loss.backward()
    return rec


def model_ops(model: Any, *example_inputs: Any, backward: bool = True, **example_kwargs: Any) -> dict:
    """The ATen ops ``model`` needs on its example inputs (forward, and backward when the
    output requires grad), each with: tier in the target list, covered or not, the impl
    kinds it has, and the impl the registry picks for the recorded arguments.
    ``missing`` names the ops no tpu impl runs for these inputs."""
    rec = trace(model, *example_inputs, backward=backward, **example_kwargs)
    targets = {t["op"]: t for t in load_targets()}
    phases: dict[Any, list[str]] = {}
    calls: dict[Any, int] = {}
    for (op, phase), n in rec.calls.items():
        phases.setdefault(op, [])
        if phase not in phases[op]:
            phases[op].append(phase)
        calls[op] = calls.get(op, 0) + n
    rows = []
    for op in sorted(phases, key=str):
        name = str(op)
        info = classify(op)
        pick = "n/a"
        if op in rec.first_args and info["best"] not in ("none", "runtime"):
            pick, refused = _pick(op, *rec.first_args[op], info["best"])
            if refused:   # every impl refuses the model's arguments: nothing runs it
                info = dict(info, covered=False, note=refused)
        elif info["best"] == "runtime":
            pick = "runtime"
        t = targets.get(name)
        rows.append({"op": name, "phases": phases[op], "calls": calls[op],
                     "tier": t["tier"] if t else None, "covered": info["covered"],
                     "by": info["best"], "kinds": info["kinds"], "pick": pick,
                     "note": info.get("note", "")})
    covered = sum(r["covered"] for r in rows)
    return {"model": type(model).__name__, "ops": rows, "total": len(rows), "covered": covered,
            "missing": [r["op"] for r in rows if not r["covered"]]}


def _pick(op: Any, args: tuple, kwargs: dict, best: str) -> tuple[str, str]:
    """The impl the route picks for the recorded arguments, and (when it refuses them)
    why each impl refused."""
    try:
        r = route(op, args, kwargs)
    except Exception as exc:  # noqa: BLE001 - a supports() that breaks on meta arguments
        return f"n/a ({type(exc).__name__})", ""
    if r.kind == "refused":
        why = "; ".join(f"{i.kind}:{i.name}: {reason}" for i, reason in r.skipped)
        return "none", f"every impl refuses the model's arguments ({why})"
    return (f"{r.impl.kind}:{r.impl.name}" if r.impl is not None else best), ""


def format_model_report(rep: dict) -> str:
    lines = [f"model {rep['model']}: {rep['covered']}/{rep['total']} ATen ops covered on tpu"
             + (f"; missing: {', '.join(rep['missing'])}" if rep["missing"] else ""), ""]
    lines.append(f"{'op':<52} {'phase':<17} {'calls':>5} {'tier':>4} {'by':<8} pick")
    for r in rep["ops"]:
        lines.append(f"{r['op'][:52]:<52} {'+'.join(r['phases']):<17} {r['calls']:>5} "
                     f"{r['tier'] if r['tier'] is not None else '-':>4} "
                     f"{r['by'] if r['covered'] else 'MISSING':<8} {r['pick']}"
                     + (f"  ({r['note']})" if r["note"] else ""))
    return "\n".join(lines)
