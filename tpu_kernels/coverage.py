"""``python -m tpu_kernels coverage``: which target ops run on tpu, by what, how well, how fast.

Built from the live registry, not a hand-kept list: every overload of the target list
(``tpu_kernels/aten_targets.tsv``, tiers 1-3) plus every custom op (``@tpu_kernel("ns::op")``)
with its impls by kind, the impl the registry picks for a typical input (built from the
op's schema and validated by torch's meta kernel; "n/a" when none can be built), the
parity status of the last parity run, whether its kernels lower for TPU, and the
kernel-vs-XLA speed ratio of the last benchmark run.

Results files live in ``.tpu_kernels/`` in the working directory: ``parity.json`` (written
by tests/parity), ``bench.json`` (``python -m tpu_kernels bench``) and ``export.json``
(``coverage --export-check``). Their dates are shown; a file older than the newest commit
touching ``registry/`` is reported stale, a missing one as missing.

Impl kinds: ``user``, ``pallas``, ``helion``, ``xla`` (registered impls), ``runtime`` (handled
by the tpu runtime itself: copies, ``.item()``, factories), ``decomp`` (no impl: torch's
decomposition runs, or the in-place op runs its functional op's impl), ``none`` (missing).
"""
from __future__ import annotations

import argparse
import base64
import csv
import datetime
import html
import io
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import torch

from tpu_kernels.coverage_model import format_model_report, model_ops  # noqa: F401  (API)

TARGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aten_targets.tsv")
RESULTS_DIR = ".tpu_kernels"
ORDER = ("user", "pallas", "helion", "xla", "runtime", "decomp", "none")   # best first
IMPL_KINDS = ("user", "pallas", "helion", "xla")
TIERS = ("1", "2", "3", "custom")
FORMAT = 1


# -- the target list and the registry ------------------------------------------------------------
def load_targets(path: str = TARGETS) -> list[dict]:
    with open(path) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [{"op": r["op"], "packet": r["packet"], "tier": str(r["tier"]),
             "models": int(r["models"] or 0)} for r in rows]


def _overload(name: str) -> Any | None:
    from tpu_kernels.registry import lookup_op
    try:
        op = lookup_op(name)
    except ValueError:
        return None
    return op if isinstance(op, torch._ops.OpOverload) else None


def _special_ops() -> set:
    try:
        from tpu_kernels import dispatch
        return set(getattr(dispatch, "_SPECIAL", {}))
    except Exception:  # noqa: BLE001
        return set()


def _has_kernel(op: Any, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)
    except Exception:  # noqa: BLE001
        return False


# Target entries recorded on CPU that tpu never receives: the same user call reaches other
# ops on tpu. Such an entry counts as covered when those ops have impls (and the user call
# is tested: the test named here).
CPU_SPECIFIC = {
    "mkldnn_rnn_layer": (("_thnn_fused_lstm_cell", "_thnn_fused_gru_cell"),
                         "nn.LSTM/nn.GRU on tpu reach the fused cell ops (tests/ops/test_rnn.py)"),
    "mkldnn_rnn_layer_backward": (("_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell_backward"),
                                  "their backward on tpu is the cells' backward (tests/ops/test_rnn.py)"),
}


def _cpu_specific(op: Any) -> tuple[str, str] | None:
    """(kind, note) when ``op`` is a CPU-only entry whose user call is covered on tpu."""
    from tpu_kernels.registry import REGISTRY
    entry = CPU_SPECIFIC.get(op._schema.name.split("::")[1])
    if entry is None:
        return None
    targets = [getattr(torch.ops.aten, name).default for name in entry[0]]
    kinds = [i.kind for t in targets for i in REGISTRY.impls(t)]
    if not all(REGISTRY.has(t) for t in targets):
        return None
    return next(k for k in ORDER if k in kinds), f"CPU-specific: {entry[1]}"


def classify(op: Any) -> dict:
    """Impls of ``op`` by kind, the best kind (``ORDER``), and whether it is covered."""
    from tpu_kernels import registry
    from tpu_kernels.registry import REGISTRY
    kinds: dict[str, list[str]] = {}
    for impl in REGISTRY.impls(op):
        kinds.setdefault(impl.kind, []).append(impl.name)
    note = ""
    extra: dict[str, Any] = {}
    if op in _special_ops():
        best, note = "runtime", "handled by the tpu runtime (copies, .item())"
    elif getattr(op, "is_view", False):   # dispatch runs every view op as a strided view
        best, note = "runtime", "view: strided view (or value) in the tpu runtime"
    elif kinds:
        best = next(k for k in ORDER if k in kinds)
    elif _has_kernel(op, "PrivateUse1"):
        best, note = "runtime", "PrivateUse1 kernel of the tpu runtime (factories)"
    elif _cpu_specific(op) is not None:
        best, note = _cpu_specific(op)
        kinds.setdefault(best, [note])
    else:
        best = "none"
        name = op._schema.name.split("::")[1]
        if name.endswith("_"):   # the runtime runs the functional op's impl and writes back
            try:
                functional = getattr(getattr(torch.ops.aten, name[:-1]), op._overloadname)
            except AttributeError:
                functional = None
            if functional is not None and REGISTRY.has(functional):
                best, note = "decomp", f"in place via {functional}"
                extra["functional"] = functional
        if best == "none" and registry.decomposition(op) is not None:
            best, note = "decomp", "torch._decomp decomposition"
        if best == "none" and _has_kernel(op, "CompositeImplicitAutograd"):
            best, note = "decomp", "CompositeImplicitAutograd (decomposes above the tpu key)"
    if best in ("runtime", "decomp"):
        kinds.setdefault(best, [note])
    return {"kinds": kinds, "best": best, "covered": best != "none", "note": note, **extra}


# -- a typical input, from the schema ---------------------------------------------------------------
_INDEX_NAMES = ("index", "indices", "target", "idx", "offsets", "group_sizes", "counts")


def _tensor(shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


def _value(arg: Any, variant: int) -> tuple[bool, Any]:
    """(ok, value) for a required schema argument; variant 0: (8, 128) float32 tensors,
    1: index-like tensors int64 (8,), 2: square (8, 8), 3: batched (2, 8, 8), 4: (2, 4, 8, 8) images."""
    t, name = str(arg.type), arg.name
    shape = {0: (8, 128), 1: (8, 128), 2: (8, 8), 3: (2, 8, 8), 4: (2, 4, 8, 8)}[variant]
    is_index = any(n in name for n in _INDEX_NAMES)
    if t == "Tensor":
        if variant == 1 and is_index:
            return True, _tensor((8,), torch.int64)
        return True, _tensor(shape)
    if t == "List[Tensor]":
        return True, [_tensor(shape), _tensor(shape)]
    if t == "List[Optional[Tensor]]":
        return True, [_tensor((8,), torch.int64)]
    if t in ("int", "SymInt"):
        return True, (-1 if "dim" in name else 1)
    if t in ("List[int]", "List[SymInt]"):
        if name in ("size", "shape", "sizes"):
            return True, list(shape)
        if name == "stride":
            return True, [128, 1] if len(shape) == 2 else [1] * len(shape)
        if "dim" in name:
            return True, [-1]
        return True, [1]
    if t == "float":
        return True, 0.5
    if t == "bool":
        return True, False
    if t in ("number", "Scalar"):
        return True, 2
    if t == "ScalarType":
        return True, torch.float32
    return False, None


def typical_input(op: Any) -> tuple[tuple, dict, str] | None:
    """Meta-tensor arguments that torch's meta kernel accepts for ``op``, or None."""
    schema = op._schema
    for variant in range(5):
        args, kwargs, ok = [], {}, True
        positional = True
        for a in schema.arguments:
            optional = a.has_default_value() or str(a.type).startswith("Optional[")
            if optional:
                positional = False
                continue
            good, v = _value(a, variant)
            if not good:
                ok = False
                break
            if a.kwarg_only or not positional:
                kwargs[a.name] = v
            else:
                args.append(v)
        if not ok:
            continue
        try:
            with torch.no_grad():
                op(*args, **kwargs)
        except Exception:  # noqa: BLE001  (the meta kernel refuses: try the next variant)
            continue
        return tuple(args), kwargs, _describe(args, kwargs)
    return None


def _describe(args, kwargs) -> str:
    def d(v):
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(d(x) for x in v) + "]"
        return repr(v)
    return ", ".join([d(a) for a in args] + [f"{k}={d(v)}" for k, v in kwargs.items()])


def pick(op: Any, inp: tuple[tuple, dict, str] | None, on_tpu: bool = False) -> str:
    """``kind:name`` of the impl the registry picks for ``inp`` (this machine, or as on a TPU)."""
    from tpu_kernels import registry
    if inp is None:
        return "n/a"
    args, kwargs, _ = inp
    try:
        if on_tpu:
            with registry.REGISTRY.interpret(True):   # kernels enabled: their supports() decide
                impl, _ = registry.which(op, *args, **kwargs)
        else:
            impl, _ = registry.which(op, *args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        return f"n/a ({type(exc).__name__})"
    return f"{impl.kind}:{impl.name}" if impl is not None else "-"


# -- results files ------------------------------------------------------------------------------
def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def registry_changed() -> float | None:
    """Unix time of the newest commit touching registry/, or None when git cannot say."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct", "--", "registry"], cwd=_repo_root(),
                             capture_output=True, text=True, timeout=10)
        return float(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None
    except Exception:  # noqa: BLE001
        return None


def _load_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _file_state(kind: str, path: str, data: dict | None, date: str | None, changed: float | None) -> dict:
    if data is None:
        exists = os.path.exists(path)
        return {"file": path, "date": None, "state": "unreadable" if exists else "missing",
                "text": f"{kind}: {path} {'is unreadable' if exists else 'missing'}: "
                        f"{_HOW[kind]}"}
    stale = False
    try:
        ts = datetime.datetime.fromisoformat(date).timestamp() if date else os.path.getmtime(path)
        stale = changed is not None and ts < changed
    except ValueError:
        pass
    state = "stale" if stale else "current"
    text = f"{kind}: {path} from {date or 'unknown date'}"
    if stale:
        text += (f" -- STALE: older than the newest registry/ commit "
                 f"({datetime.datetime.fromtimestamp(changed).isoformat(timespec='seconds')})")
    return {"file": path, "date": date, "state": state, "text": text}


_HOW = {"parity": "no parity run recorded (run pytest tests/parity)",
        "bench": "no bench run recorded (run python -m tpu_kernels bench)",
        "export": "no TPU export check recorded (run coverage --export-check)"}


def parity_status(entry: dict | None, have_file: bool) -> tuple[str, str]:
    """(status, detail) of one op from parity.json."""
    if not have_file:
        return "no run", "no parity run recorded"
    if entry is None:
        return "not run", "not in the last parity run"
    impls = entry.get("impls") or {}
    if not impls:
        return "untested", "no impl results"
    st = {k: v.get("status", "untested") for k, v in impls.items()}
    for status in ("fail", "known_failure"):
        bad = [k for k, s in st.items() if s == status]
        if bad:
            return status, "; ".join(f"{k}: {impls[k].get('reason', '')}"[:160] for k in bad)
    if all(s == "pass" for s in st.values()):
        return "pass", ", ".join(f"{k} ({impls[k].get('examples', '?')} examples)" for k in st)
    if any(s == "pass" for s in st.values()):
        return "pass", "; ".join(f"{k}: {s}" for k, s in st.items())
    return "untested", "; ".join(f"{k}: {impls[k].get('reason', s)}"[:160] for k, s in st.items())


def bench_speed(op_name: str, bench: dict | None) -> tuple[float | None, str]:
    """(kernel/XLA speed-up, text) for ``op_name`` from bench.json: XLA median / kernel median,
    geometric mean over cases timed for both (never interpret-mode rows)."""
    if not bench:
        return None, "-"
    rows = [r for r in bench.get("results", []) if r.get("op") == op_name and r.get("status") == "ok"
            and r.get("mode") != "interpret" and r.get("median_s")]
    if not rows:
        return None, "-"
    by_case: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        by_case.setdefault((r["case"], r["dtype"]), {}).setdefault(r["kind"], []).append(r["median_s"])
    ratios, vs_cpu = [], []
    for kinds in by_case.values():
        if "xla" in kinds:
            kern = [t for k in ("pallas", "helion", "user") for t in kinds.get(k, [])]
            if kern:
                ratios.append(min(kinds["xla"]) / min(kern))
            if "torch_cpu" in kinds:
                vs_cpu.append(min(kinds["torch_cpu"]) / min(kinds["xla"]))
    import math
    if ratios:
        g = math.exp(sum(map(math.log, ratios)) / len(ratios))
        return g, f"kernel x{g:.2f} vs xla ({len(ratios)} cases)"
    if vs_cpu:
        g = math.exp(sum(map(math.log, vs_cpu)) / len(vs_cpu))
        return None, f"no kernel timing; xla x{g:.2f} vs torch-cpu"
    return None, "-"


# -- TPU export check ----------------------------------------------------------------------------
def _kernel_inputs(op: Any, inp) -> list[tuple[tuple, dict, str]]:
    """Inputs to export a kernel with: the benchmark definitions' cases first (shapes the
    kernel was written for), then the typical input."""
    out = []
    try:
        from tpu_kernels.bench.runner import load_benchmarks
        for b in load_benchmarks():
            if b.op == str(op):
                for c in sorted(b.cases, key=lambda c: not c.quick)[:4]:
                    a, kw = b.make_args(c)
                    out.append((a, kw, c.label + " " + str(c.dtype).replace("torch.", "")))
    except Exception:  # noqa: BLE001
        pass
    if inp is not None:
        out.append(inp)
    return out


def lower_impl(impl: Any, args: tuple, kwargs: dict) -> None:
    """Export ``impl.fn`` for TPU (Pallas -> Mosaic lowering) on abstract copies of the args."""
    import contextlib
    from unittest import mock

    import jax
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from tpu_kernels.pallas import tpu_info
    from tpu_kernels.pallas.export_check import lower_for_tpu
    from tpu_kernels.registry.dtypes import to_jax_dtype

    leaves, spec = tree_flatten((args, kwargs))
    pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    structs = [jax.ShapeDtypeStruct(tuple(leaves[i].shape), to_jax_dtype(leaves[i].dtype)) for i in pos]

    def f(*arrays):
        full = list(leaves)
        for i, a in zip(pos, arrays):
            full[i] = a
        a, kw = tree_unflatten(full, spec)
        return impl.fn(*a, **kw)

    helion_ctx = contextlib.nullcontext()
    try:
        from tpu_kernels.helion_kernels._common import tpu_lowering
        helion_ctx = tpu_lowering()
    except Exception:  # noqa: BLE001
        pass
    # resolve_interpret(None) asks tpu_info.on_tpu(): say yes, so kernels take the Mosaic path
    with mock.patch.object(tpu_info, "on_tpu", lambda: True), helion_ctx:
        exported = lower_for_tpu(f, *structs)
    if "tpu_custom_call" not in exported.mlir_module():
        raise RuntimeError("lowered, but no Mosaic kernel (tpu_custom_call) in the module: "
                           "the kernel did not take its TPU path")


def export_check(op: Any, inp, progress: Callable[[str], None]) -> dict[str, dict]:
    """Per kernel impl of ``op``: lowered for TPU ("ok"), failed ("fail", reason) or "n/a"."""
    from tpu_kernels.registry import REGISTRY
    from tpu_kernels.coverage_model import _meta
    from torch.utils._pytree import tree_map
    results: dict[str, dict] = {}
    today = datetime.datetime.now().isoformat(timespec="seconds")
    for impl in REGISTRY.impls(op):
        if impl.kind not in ("pallas", "helion"):
            continue
        label = f"{impl.kind}:{impl.name}"
        progress(f"coverage: export check {op} {label}")
        res = {"status": "n/a", "reason": "no input the kernel accepts", "date": today}
        for a, kw, desc in _kernel_inputs(op, inp):
            if impl.check(*tree_map(_meta, a), **tree_map(_meta, kw)) is not None:
                continue
            try:
                lower_impl(impl, a, kw)
                res = {"status": "ok", "input": desc, "date": today}
            except Exception as exc:  # noqa: BLE001
                res = {"status": "fail", "input": desc, "reason": f"{type(exc).__name__}: {exc}"[:300],
                       "date": today}
            break
        results[label] = res
    return results


# -- the report ---------------------------------------------------------------------------------
def _progress_printer(enabled: bool = True) -> Callable[[str], None]:
    last = [0.0]

    def progress(msg: str) -> None:
        if enabled and time.perf_counter() - last[0] > 1.0:
            last[0] = time.perf_counter()
            print(msg, file=sys.stderr, flush=True)
    return progress


def build(*, results_dir: str = RESULTS_DIR, do_export_check: bool = False,
          progress: Callable[[str], None] | None = None) -> dict:
    """The whole report as a dict (what ``--format json`` prints)."""
    import tpu_kernels  # noqa: F401  (device + registry loaded)
    from tpu_kernels.registry import REGISTRY
    from tpu_kernels.registry.custom_op import DEFINED

    progress = progress or _progress_printer()
    changed = registry_changed()
    parity_path = os.path.join(results_dir, "parity.json")
    bench_path = os.path.join(results_dir, "bench.json")
    export_path = os.path.join(results_dir, "export.json")
    parity = _load_json(parity_path)
    bench = _load_json(bench_path)
    export = _load_json(export_path)
    export_new: dict[str, dict] = {}

    entries = [(t["op"], t["tier"], t["models"]) for t in load_targets()]
    target_names = {e[0] for e in entries}
    for qualname, custom in DEFINED.items():
        name = str(custom.op)
        if name not in target_names:
            entries.append((name, "custom", None))
    rows = []
    start = time.perf_counter()
    for i, (name, tier, models) in enumerate(entries):
        progress(f"coverage: [{i + 1}/{len(entries)}] {name} ({time.perf_counter() - start:.0f}s)")
        op = _overload(name)
        row: dict[str, Any] = {"op": name, "tier": tier, "models": models}
        if op is None:
            row.update(kinds={}, best="none", covered=False, note="overload not in this torch build",
                       input="n/a", pick="n/a", pick_tpu="n/a")
        else:
            info = classify(op)
            inp = typical_input(op) if info["best"] not in ("none", "runtime") else None
            target = info.get("functional") or op   # in-place ops run their functional op's impl
            suffix = " (in place)" if info.get("functional") else ""
            row.update(kinds=info["kinds"], best=info["best"], covered=info["covered"], note=info["note"],
                       input=inp[2] if inp else "n/a",
                       pick=pick(target, inp) + suffix if info["best"] != "runtime" else "runtime",
                       pick_tpu=pick(target, inp, on_tpu=True) + suffix if info["best"] != "runtime" else "runtime")
        status, detail = parity_status((parity or {}).get("ops", {}).get(name), parity is not None)
        row["parity"], row["parity_detail"] = status, detail
        kernel_impls = [k for k in ("pallas", "helion") if k in row["kinds"]]
        if not kernel_impls:
            row["export"] = "-"
        elif do_export_check and op is not None:
            res = export_check(op, inp, progress)
            export_new[name] = res
            row["export"] = _export_text(res)
            row["export_detail"] = res
        elif export and name in export.get("ops", {}):
            row["export"] = _export_text(export["ops"][name])
            row["export_detail"] = export["ops"][name]
        else:
            row["export"] = "not checked"
        ratio, text = bench_speed(name, bench)
        row["speed"], row["speed_ratio"] = text, ratio
        rows.append(row)

    if do_export_check:
        export = {"format": 1, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "ops": {**((export or {}).get("ops", {})), **export_new}}
        os.makedirs(results_dir, exist_ok=True)
        with open(export_path, "w") as f:
            json.dump(export, f, indent=1)

    files = {
        "parity": _file_state("parity", parity_path, parity, (parity or {}).get("updated"), changed),
        "bench": _file_state("bench", bench_path, bench, (bench or {}).get("date"), changed),
        "export": _file_state("export", export_path, export, (export or {}).get("date"), changed),
    }
    kernels: dict[str, int] = {}
    for op in REGISTRY.ops():
        for impl in REGISTRY.impls(op):
            kernels[impl.kind] = kernels.get(impl.kind, 0) + 1
    return {"format": FORMAT, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "torch": torch.__version__, "registry_changed": (
                datetime.datetime.fromtimestamp(changed).isoformat(timespec="seconds") if changed else None),
            "files": files, "totals": totals(rows, kernels, parity is not None), "rows": rows}


def _export_text(res: dict) -> str:
    if not res:
        return "-"
    sts = [v.get("status") for v in res.values()]
    if all(s == "ok" for s in sts):
        return "ok"
    if any(s == "fail" for s in sts):
        return "FAIL"
    return "/".join(sorted(set(sts)))


def totals(rows: list[dict], kernels: dict[str, int], have_parity: bool) -> dict:
    tiers: dict[str, dict] = {}
    for r in rows:
        t = tiers.setdefault(r["tier"], {"total": 0, "covered": 0, "by_kind": {k: 0 for k in ORDER}})
        t["total"] += 1
        t["covered"] += r["covered"]
        t["by_kind"][r["best"]] += 1
    targets = [r for r in rows if r["tier"] != "custom"]
    tested = [r for r in rows if r["parity"] in ("pass", "fail", "known_failure")]
    passed = sum(r["parity"] == "pass" for r in tested)
    return {
        "tiers": tiers,
        "targets": len(targets), "targets_covered": sum(r["covered"] for r in targets),
        "gap": len(targets) - sum(r["covered"] for r in targets),
        "custom_ops": sum(r["tier"] == "custom" for r in rows),
        "kernels_by_kind": {k: kernels.get(k, 0) for k in IMPL_KINDS},
        "parity": {"recorded": have_parity, "tested": len(tested), "passed": passed,
                   "rate": passed / len(tested) if tested else None},
    }


def totals_line(rep: dict) -> str:
    t = rep["totals"]
    pct = 100 * t["targets_covered"] / max(t["targets"], 1)
    tiers = ", ".join(f"tier {k} {v['covered']}/{v['total']}" for k, v in sorted(t["tiers"].items())
                      if k != "custom")
    kk = t["kernels_by_kind"]
    p = t["parity"]
    par = ("no parity run recorded" if not p["recorded"] else
           f"parity {p['passed']}/{p['tested']} ops pass ({100 * p['rate']:.0f}%)" if p["tested"]
           else "parity: no op tested")
    return (f"coverage: {t['targets_covered']}/{t['targets']} target overloads ({pct:.1f}%; {tiers}); "
            f"{t['custom_ops']} custom ops; impls: pallas {kk['pallas']}, helion {kk['helion']}, "
            f"user {kk['user']}, xla {kk['xla']}; {par}; gap {t['gap']}")


# -- filtering and output -------------------------------------------------------------------------
def filter_rows(rows: list[dict], tier: str | None = None, kind: str | None = None,
                missing: bool = False, op: str | None = None) -> list[dict]:
    out = rows
    if tier:
        tiers = {t.strip() for t in str(tier).split(",")}
        out = [r for r in out if r["tier"] in tiers]
    if kind:
        kinds = {k.strip() for k in kind.split(",")}
        out = [r for r in out if kinds & (set(r["kinds"]) | {r["best"]})]
    if missing:
        out = [r for r in out if not r["covered"]]
    if op:
        out = [r for r in out if op in r["op"]]
    return out


def _impls_text(r: dict) -> str:
    kinds = sorted(r["kinds"], key=ORDER.index)
    return " ".join(f"{k}" + (f"x{len(r['kinds'][k])}" if len(r["kinds"][k]) > 1 and k in IMPL_KINDS else "")
                    for k in kinds) or "-"


_TCOLS = (("op", 48), ("tier", 6), ("impls", 16), ("pick (here)", 26), ("pick (TPU)", 26),
          ("parity", 13), ("export", 11), ("speed", 0))


def format_text(rep: dict, rows: list[dict]) -> str:
    lines = [totals_line(rep), ""]
    for k, t in sorted(rep["totals"]["tiers"].items()):
        kinds = ", ".join(f"{kk} {n}" for kk, n in t["by_kind"].items() if n)
        lines.append(f"  tier {k:<7} {t['covered']:>4}/{t['total']:<4} covered  ({kinds})")
    lines.append("")
    for f in rep["files"].values():
        lines.append(f["text"])
    lines += ["", " ".join(f"{n:<{w}}" for n, w in _TCOLS).rstrip()]
    lines.append("-" * 160)
    for r in rows:
        cells = [r["op"][:48], r["tier"], _impls_text(r)[:16], r["pick"][:26], r["pick_tpu"][:26],
                 r["parity"][:13], r["export"][:11], r["speed"]]
        lines.append(" ".join(f"{c:<{w}}" for c, (_, w) in zip(cells, _TCOLS)).rstrip())
    lines.append(f"\n{len(rows)} rows")
    return "\n".join(lines)


def format_markdown(rep: dict, rows: list[dict]) -> str:
    out = [f"**{totals_line(rep)}**", ""]
    out += [f"- {f['text']}" for f in rep["files"].values()] + [""]
    out.append("| tier | covered | " + " | ".join(ORDER) + " |")
    out.append("|---|---|" + "---|" * len(ORDER))
    for k, t in sorted(rep["totals"]["tiers"].items()):
        out.append(f"| {k} | {t['covered']}/{t['total']} | " + " | ".join(str(t["by_kind"][x]) for x in ORDER) + " |")
    out += ["", "| op | tier | impls | pick (here) | pick (TPU) | parity | TPU export | speed |",
            "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"`{r['op']}`", r["tier"], _impls_text(r), r["pick"], r["pick_tpu"], r["parity"],
                 r["export"], r["speed"]]
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out) + "\n"


_JS = """
function sortBy(th){const t=th.closest('table'),i=[...th.parentNode.children].indexOf(th),
asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';const b=t.tBodies[0];
const rows=[...b.rows].sort((x,y)=>{const a=x.cells[i].innerText,c=y.cells[i].innerText,
n=parseFloat(a),m=parseFloat(c);const r=(!isNaN(n)&&!isNaN(m))?n-m:a.localeCompare(c);return asc?r:-r;});
rows.forEach(r=>b.appendChild(r));}
function filt(v){for(const r of document.querySelectorAll('#ops tbody tr'))
r.style.display=r.innerText.toLowerCase().includes(v.toLowerCase())?'':'none';}
"""


def format_html(rep: dict, rows: list[dict]) -> str:
    png = chart_png(rep)
    e = html.escape
    head = "".join(f"<th onclick='sortBy(this)'>{e(n)}</th>" for n in
                   ("op", "tier", "impls", "pick (here)", "pick (TPU)", "parity", "TPU export", "speed"))
    body = []
    for r in rows:
        cls = "miss" if not r["covered"] else ""
        cells = [r["op"], r["tier"], _impls_text(r), r["pick"], r["pick_tpu"], r["parity"], r["export"], r["speed"]]
        title = e(r.get("parity_detail", ""))
        body.append(f"<tr class='{cls}'>" + "".join(
            f"<td title='{title}'>{e(str(c))}</td>" if j == 5 else f"<td>{e(str(c))}</td>"
            for j, c in enumerate(cells)) + "</tr>")
    files = "".join(f"<li>{e(f['text'])}</li>" for f in rep["files"].values())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>tpu_kernels coverage</title>
<style>body{{font:13px sans-serif;margin:1em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px}}th{{cursor:pointer;background:#eee;position:sticky;top:0}}
tr.miss td{{background:#fdd}}</style><script>{_JS}</script></head><body>
<h1>tpu_kernels op coverage</h1><p><b>{e(totals_line(rep))}</b></p><p>generated {e(rep['date'])}</p>
<ul>{files}</ul>
<img alt="coverage by tier and impl kind" src="data:image/png;base64,{base64.b64encode(png).decode()}">
<p>filter: <input oninput="filt(this.value)"> (click a column header to sort)</p>
<table id="ops"><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></body></html>
"""


_COLORS = {"user": "#9467bd", "pallas": "#d62728", "helion": "#ff7f0e", "xla": "#1f77b4",
           "runtime": "#17becf", "decomp": "#bcbd22", "none": "#cccccc"}


def chart_png(rep: dict) -> bytes:
    """Stacked bars: per tier, overloads by the best impl kind they have."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tiers = [k for k in TIERS if k in rep["totals"]["tiers"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0] * len(tiers)
    for kind in ORDER:
        vals = [rep["totals"]["tiers"][t]["by_kind"][kind] for t in tiers]
        ax.bar([f"tier {t}" if t != "custom" else "custom ops" for t in tiers], vals, bottom=bottom,
               label=kind, color=_COLORS[kind])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("op overloads")
    ax.set_title(f"tpu_kernels coverage by tier and impl kind ({rep['date'][:10]})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


# -- JSON schema (a small one, checked without dependencies) ---------------------------------------
_STR, _NUM, _BOOL, _NULL = {"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}
SCHEMA: dict = {
    "type": "object",
    "required": ["format", "date", "files", "totals", "rows"],
    "properties": {
        "format": {"type": "integer"}, "date": _STR,
        "files": {"type": "object", "values": {"type": "object", "required": ["file", "date", "state", "text"],
                                                "properties": {"state": {"enum": ["missing", "unreadable", "stale", "current"]}}}},
        "totals": {"type": "object",
                   "required": ["tiers", "targets", "targets_covered", "gap", "kernels_by_kind", "parity"],
                   "properties": {"targets": {"type": "integer"}, "targets_covered": {"type": "integer"},
                                  "gap": {"type": "integer"},
                                  "kernels_by_kind": {"type": "object", "values": {"type": "integer"}}}},
        "rows": {"type": "array", "items": {
            "type": "object",
            "required": ["op", "tier", "kinds", "best", "covered", "input", "pick", "pick_tpu", "parity",
                         "export", "speed"],
            "properties": {"op": _STR, "tier": {"enum": list(TIERS)}, "best": {"enum": list(ORDER)},
                           "covered": _BOOL, "kinds": {"type": "object", "values": {"type": "array"}},
                           "pick": _STR, "pick_tpu": _STR, "input": _STR,
                           "parity": {"enum": ["pass", "fail", "known_failure", "untested", "not run", "no run"]},
                           "speed_ratio": {"anyOf": [_NUM, _NULL]}}}},
    },
}
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
          "integer": int, "number": (int, float)}


def validate(value: Any, schema: dict = SCHEMA, path: str = "$") -> list[str]:
    """Errors of ``value`` against the small schema subset used here (type, required,
    properties, values, items, enum, anyOf)."""
    errs: list[str] = []
    if "anyOf" in schema:
        if all(validate(value, s, path) for s in schema["anyOf"]):
            errs.append(f"{path}: matches none of anyOf")
        return errs
    t = schema.get("type")
    if t:
        ok = isinstance(value, _TYPES[t]) and not (t in ("integer", "number") and isinstance(value, bool))
        if not ok:
            return [f"{path}: expected {t}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        errs += [f"{path}: missing {k!r}" for k in schema.get("required", ()) if k not in value]
        for k, s in schema.get("properties", {}).items():
            if k in value:
                errs += validate(value[k], s, f"{path}.{k}")
        if "values" in schema:
            for k, v in value.items():
                errs += validate(v, schema["values"], f"{path}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            errs += validate(v, schema["items"], f"{path}[{i}]")
    return errs


# -- command line --------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", help="1, 2, 3 or custom (comma-separated)")
    p.add_argument("--kind", help="ops having an impl of this kind: pallas, helion, xla, user, runtime, decomp, none")
    p.add_argument("--missing", action="store_true", help="only target overloads with no tpu impl")
    p.add_argument("--op", help="substring of the op name, e.g. softmax")
    p.add_argument("--format", choices=("text", "json", "markdown", "html"), default="text")
    p.add_argument("--output", "-o", metavar="PATH", help="write the report here instead of stdout")
    p.add_argument("--chart", metavar="PATH", help="write the PNG chart (stacked bars per tier by kind)")
    p.add_argument("--export-check", action="store_true",
                   help="lower every Pallas/Helion impl for TPU now (records .tpu_kernels/export.json)")
    p.add_argument("--results", default=RESULTS_DIR, metavar="DIR", help="results directory (.tpu_kernels)")
    p.add_argument("--model", metavar="MODULE:FACTORY",
                   help="trace a model: FACTORY() returns (model, example_inputs); lists the ops it needs")


def main(argv: list[str] | None = None, out=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tpu_kernels coverage", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return main_args(p.parse_args(argv), out=out)


def _load_model(spec: str):
    import importlib
    mod_name, _, fn_name = spec.partition(":")
    if not fn_name:
        raise SystemExit("coverage --model: expected MODULE:FACTORY")
    sys.path.insert(0, os.getcwd())
    made = getattr(importlib.import_module(mod_name), fn_name)()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise SystemExit("coverage --model: FACTORY() must return (model, example_inputs)")
    model, inputs = made
    return model, inputs if isinstance(inputs, (tuple, list)) else (inputs,)


def main_args(a: argparse.Namespace, out=None) -> int:
    write = out or (lambda s: print(s))
    if a.model:
        import tpu_kernels  # noqa: F401
        model, inputs = _load_model(a.model)
        print(f"coverage: tracing {a.model} on CPU (forward + backward)...", file=sys.stderr)
        rep = model_ops(model, *inputs)
        text = json.dumps(rep, indent=1, default=str) if a.format == "json" else format_model_report(rep)
        _emit(text, a.output, write)
        return 0
    rep = build(results_dir=a.results, do_export_check=a.export_check)
    rows = filter_rows(rep["rows"], a.tier, a.kind, a.missing, a.op)
    if a.format == "json":
        shown = dict(rep, rows=rows)
        errs = validate(shown)
        if errs:  # the report's own format drifted: say so loudly
            raise AssertionError("coverage JSON does not match its schema:\n" + "\n".join(errs[:20]))
        text = json.dumps(shown, indent=1, default=str)
    elif a.format == "markdown":
        text = format_markdown(rep, rows)
    elif a.format == "html":
        text = format_html(rep, rows)
    else:
        text = format_text(rep, rows)
    _emit(text, a.output, write)
    if a.chart:
        os.makedirs(os.path.dirname(os.path.abspath(a.chart)), exist_ok=True)
        with open(a.chart, "wb") as f:
            f.write(chart_png(rep))
        print(f"chart: {a.chart}", file=sys.stderr)
    return 0


def _emit(text: str, path: str | None, write) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        print(f"coverage: wrote {path}", file=sys.stderr)
    else:
        write(text)
