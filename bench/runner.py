"""``python -m tpu_kernels bench``: time every impl of every benchmarked kernel.

For each ``KernelBench`` (``bench/defs/*.py``) and case: every impl the registry has for
the op, each forced with ``registry.force(impl)`` and called through the tpu device
(tensors moved to tpu first, synchronised with ``block_until_ready``), plus torch on
the CPU (the op called on CPU tensors). Timings of tpu impls therefore include eager
dispatch overhead: what a user of ``model.to("tpu")`` sees.

Pallas and Helion impls run off TPU only with ``--interpret``: they are then checked for
correctness, labelled ``interpret`` and never reported as speed.

Results go to ``.tpu_kernels/bench.json`` (``--json PATH``), where the coverage report
reads them; plots to ``.tpu_kernels/bench/`` (``--plots DIR``).
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import sys
import time
from typing import Any, Callable, Iterable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from tpu_kernels import registry
from tpu_kernels.aot import cost_plot
from tpu_kernels.bench import cost_columns, machine, peaks, report
from tpu_kernels.bench.spec import Case, KernelBench
from tpu_kernels.bench.correctness import check_outputs
from tpu_kernels.bench.timing import measure_call, outputs, sync_all
from tpu_kernels.pallas.tpu_info import CHECKED_GENERATIONS, on_tpu
from tpu_kernels.registry import manifest
from tpu_kernels.registry.kinds import KERNEL_KINDS

RESULTS = os.path.join(".tpu_kernels", "bench.json")
PLOTS = os.path.join(".tpu_kernels", "bench")
FORMAT = 1
SETTLE_S = 0.15
HEADER_NOTE = ("tpu impls are timed through the tpu device in eager mode (tensors on tpu, the op "
               "called with the impl forced, synchronised with block_until_ready): the times "
               "include eager dispatch overhead, which is what users see. torch_cpu is the op on "
               "CPU tensors. compile = first call minus steady-state median (JAX's persistent "
               "compile cache can make it small). Interpret-mode rows are correctness runs, not speed.")

DTYPES = {"float32": torch.float32, "f32": torch.float32, "fp32": torch.float32,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
          "f16": torch.float16}


# -- definitions -------------------------------------------------------------------------------
def load_benchmarks() -> list[KernelBench]:
    """Every kernel's ``KernelBench`` entries, from the kernel manifest's bench modules."""
    out: list[KernelBench] = []
    for name in manifest.bench_modules():
        out.extend(importlib.import_module(name).BENCHMARKS)
    return out


def kernel_cases(k: manifest.Kernel) -> list[tuple[KernelBench, Case]]:
    """(KernelBench, Case) pairs of kernel ``k``: the shapes it is written for (those not
    marked ``quick`` are the production ones a real TPU compile should check)."""
    benches = importlib.import_module(k.bench_module).BENCHMARKS
    return [(b, c) for b in benches if b.name in k.bench for c in b.cases]


def select(benches: Iterable[KernelBench], kernel: str | None = None, shape: str | None = None,
           dtype: str | None = None, quick: bool = False) -> list[tuple[KernelBench, Case]]:
    """(bench, case) pairs left by the filters. ``kernel``: comma-separated names (exact,
    else substring); ``shape``: substring of the case label (``m128``, ``n64xvocab1000``);
    ``dtype``: ``float32``/``bf16``..."""
    names = [k.strip() for k in kernel.split(",")] if kernel else None
    want_dtype = None
    if dtype:
        if dtype not in DTYPES:
            raise SystemExit(f"bench: unknown --dtype {dtype!r}; use one of {sorted(DTYPES)}")
        want_dtype = DTYPES[dtype]
    benches = list(benches)
    if names:
        exact = [b for b in benches if b.name in names]
        benches = exact or [b for b in benches if any(n in b.name for n in names)]
        if not benches:
            raise SystemExit(f"bench: no kernel matches --kernel {kernel!r}")
    out = []
    for b in benches:
        for c in b.cases:
            if quick and not c.quick:
                continue
            if shape and shape not in c.label:
                continue
            if want_dtype is not None and c.dtype != want_dtype:
                continue
            out.append((b, c))
    return out


# -- one case ------------------------------------------------------------------------------------
def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def _clone(x: Any) -> Any:
    return x.clone() if isinstance(x, torch.Tensor) else x


def _to_tpu(x: Any) -> Any:
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def impl_label(impl: Any) -> str:
    return f"{impl.kind}:{impl.name}"


def op_id(bench: KernelBench) -> str:
    """The op as results files and the coverage report name it (``aten.mm.default``)."""
    try:
        return str(bench.overload())
    except ValueError:
        return bench.op


def _result(bench: KernelBench, c: Case, impl: str, kind: str, **kw: Any) -> dict:
    r = {"kernel": bench.name, "op": op_id(bench), "case": c.label, "dims": dict(c.dims),
         "dtype": str(c.dtype).replace("torch.", ""), "impl": impl, "kind": kind,
         "flops": float(bench.flops(c)), "bytes": float(bench.bytes(c))}
    r.update(kw)
    return r


def _add_rates(r: dict, peak) -> None:
    med = r.get("median_s")
    if not med or r.get("mode") == "interpret":
        r.update(flop_s=None, bytes_s=None, peak_fraction=None)
        return
    r["flop_s"] = r["flops"] / med
    r["bytes_s"] = r["bytes"] / med
    if r["flops"] > 0 and r["bytes"] > 0:
        bound = peak.attainable(r["flops"] / r["bytes"])
        r["peak_fraction"] = r["flop_s"] / bound
    elif r["bytes"] > 0:
        r["peak_fraction"] = r["bytes_s"] / peak.bytes_per_s
    else:
        r["peak_fraction"] = r["flop_s"] / peak.flops if r["flops"] else None
    r["peak"] = peak.name


def impl_wanted(label: str, kind: str, wanted: list[str] | None) -> bool:
    """``--impl xla,cpu`` keeps kinds (``xla``), labels (``pallas:mm``) and ``cpu``/``torch_cpu``."""
    if not wanted:
        return True
    for w in wanted:
        if w in (label, kind) or (w in ("cpu", "torch", "torch_cpu") and kind == "torch_cpu"):
            return True
    return False


def run_case(bench: KernelBench, c: Case, *, impls: list[str] | None, interpret: bool,
             warmup: int, iters: int, budget_s: float, device_peak, cpu_peak,
             emit: Callable[[dict], None]) -> list[dict]:
    """Every selected impl of ``bench.op`` on case ``c``, then torch on the CPU."""
    try:
        op = bench.overload()
    except ValueError as exc:   # a definition ahead of its op
        r = _result(bench, c, "none", "none", device="-", mode="-", status="skipped",
                    reason=f"op {bench.op} is not defined ({type(exc).__name__})")
        emit(r)
        return [r]
    args, kwargs = bench.make_args(c)
    results: list[dict] = []

    def done(r: dict) -> None:
        results.append(r)
        emit(r)

    # torch on the CPU first: its first call's outputs are the reference for the check
    cpu_args, cpu_kwargs = tree_map(_clone, args), tree_map(_clone, kwargs)
    ref: list[torch.Tensor] | None = None
    ref_error = None
    # Let threads left busy by the previous case's XLA compiles go idle: on a small shared
    # CPU, torch's intra-op threads otherwise wait for scheduler ticks (ms-sized stalls).
    time.sleep(SETTLE_S)
    try:
        stats, out = measure_call(lambda: op(*cpu_args, **cpu_kwargs),
                             lambda o: [], warmup=warmup, iters=iters, budget_s=budget_s)
        ref = [t.clone() for t in outputs(out, cpu_args)]
        # in-place ops returning nothing: the reference is the state after ONE call
        if not [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]:
            one_args, one_kwargs = tree_map(_clone, args), tree_map(_clone, kwargs)
            ref = [t.clone() for t in outputs(op(*one_args, **one_kwargs), one_args)]
        r = _result(bench, c, "torch_cpu", "torch_cpu", device="cpu", mode="torch-cpu",
                    status="ok", **stats)
        _add_rates(r, cpu_peak)
    except Exception as exc:  # noqa: BLE001 - the report says what failed
        ref_error = f"{type(exc).__name__}: {exc}"
        r = _result(bench, c, "torch_cpu", "torch_cpu", device="cpu", mode="torch-cpu",
                    status="error", reason=ref_error[:300])
    cpu_result = r
    cpu_wanted = impl_wanted("torch_cpu", "torch_cpu", impls)

    all_impls = registry.impls(op)
    if not all_impls and impl_wanted("none", "none", impls):
        done(_result(bench, c, "none", "none", device="tpu", mode="-", status="skipped",
                     reason="no impl registered for this op"))
    meta_args, meta_kwargs = tree_map(_meta, args), tree_map(_meta, kwargs)
    for impl in all_impls:
        label = impl_label(impl)
        if not impl_wanted(label, impl.kind, impls):
            continue
        is_kernel = impl.kind in KERNEL_KINDS
        mode = "interpret" if is_kernel and not on_tpu() else "compiled"
        base = dict(device="tpu", mode=mode)
        if mode == "interpret" and not interpret:
            done(_result(bench, c, label, impl.kind, status="skipped",
                         reason="off TPU: kernels run only in interpret mode (pass --interpret)",
                         **base))
            continue
        refusal = _refusal(impl, op, meta_args, meta_kwargs, is_kernel)
        if refusal:
            done(_result(bench, c, label, impl.kind, status="skipped",
                         reason=f"refused: {refusal}", **base))
            continue
        try:
            t_args, t_kwargs = tree_map(_to_tpu, args), tree_map(_to_tpu, kwargs)
            sync_all([t_args, t_kwargs])
            with registry.force(impl, interpret=is_kernel):
                def call():
                    return op(*t_args, **t_kwargs)

                def outs(o):
                    return outputs(o, t_args)
                if mode == "interpret":
                    stats, out = measure_call(call, outs, warmup=0, iters=1, budget_s=0.0)
                else:
                    stats, out = measure_call(call, outs, warmup=warmup, iters=iters, budget_s=budget_s)
            got = outputs(out, t_args)
            if ref is None:
                check = {"ok": None, "note": f"no CPU reference ({ref_error})"}
            else:
                if not [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]:
                    # in-place op: compare the state after one call on fresh tensors
                    f_args, f_kwargs = tree_map(_to_tpu, args), tree_map(_to_tpu, kwargs)
                    with registry.force(impl, interpret=is_kernel):
                        got = outputs(op(*f_args, **f_kwargs), f_args)
                check = check_outputs(got, ref, c.dtype)
            r = _result(bench, c, label, impl.kind, status="ok", check=check, **stats, **base)
            _add_rates(r, device_peak)
            if cpu_result.get("median_s") and mode == "compiled":
                r["speedup_vs_cpu"] = cpu_result["median_s"] / r["median_s"]
        except Exception as exc:  # noqa: BLE001
            r = _result(bench, c, label, impl.kind, status="error",
                        reason=f"{type(exc).__name__}: {exc}"[:300], **base)
        done(r)
    if cpu_wanted:
        done(cpu_result)
    return results


def _refusal(impl: Any, op: Any, meta_args: tuple, meta_kwargs: dict, is_kernel: bool) -> str | None:
    """Why the route would not run ``impl`` for this case while it is forced, or None."""
    with registry.force(impl, interpret=is_kernel):
        r = registry.route(op, meta_args, meta_kwargs)
    if r.impl is impl:
        return None
    why = next((why for i, why in r.skipped if i is impl), f"the route takes {r.kind} {r.impl}")
    return why.removeprefix("forced, but refuses: ")


# -- the whole run ---------------------------------------------------------------------------------
def run(*, kernel: str | None = None, shape: str | None = None, dtype: str | None = None,
        impl: str | None = None, quick: bool = False, interpret: bool = False,
        json_path: str | None = RESULTS, plots: str | None = PLOTS, compare: str | None = None,
        warmup: int | None = None, iters: int | None = None, out=print,
        progress=None, cost_chips: list[str] | None = None) -> dict:
    """Run the selected benchmarks; print the table; write JSON and plots. Returns the run.
    ``cost_chips``: also the cost model's figures for these chips (``bench.cost_columns``)."""
    if progress is None:
        def progress(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)
    pairs = select(load_benchmarks(), kernel, shape, dtype, quick)
    wanted = [w.strip() for w in impl.split(",")] if impl else None
    warmup = (1 if quick else 3) if warmup is None else warmup
    iters = (20 if quick else 50) if iters is None else iters
    budget_s = 0.3 if quick else 2.0

    progress("bench: measuring the CPU peak (matmul + copy)...")
    cpu_peak = peaks.cpu_peak()
    device_peak = peaks.device_peak()
    run_info = {
        "format": FORMAT,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        **machine.describe(), "device": peaks.device_description(),
        "device_peak": device_peak.as_dict(), "cpu_peak": cpu_peak.as_dict(),
        "note": HEADER_NOTE,
        "options": {"kernel": kernel, "shape": shape, "dtype": dtype, "impl": impl,
                    "quick": quick, "interpret": interpret, "warmup": warmup, "iters": iters},
        "results": [],
    }
    previous = report.load(compare) if compare else None
    for line in report.header(run_info):
        out(line)
    note = machine.mismatch(run_info, previous) if previous is not None else None
    if note:
        out(note)
    out(report.table_header(compare=previous is not None))
    start = time.perf_counter()
    for i, (b, c) in enumerate(pairs):
        progress(f"bench: [{i + 1}/{len(pairs)}] {b.name} {c.label} {report.short_dtype(c.dtype)} "
                 f"({time.perf_counter() - start:.0f}s)")

        def emit(r: dict) -> None:
            if previous is not None:
                report.attach_compare(r, previous)
            out(report.table_row(r, compare=previous is not None))
        run_info["results"].extend(run_case(
            b, c, impls=wanted, interpret=interpret, warmup=warmup, iters=iters,
            budget_s=budget_s, device_peak=device_peak, cpu_peak=cpu_peak, emit=emit))
    run_info["elapsed_s"] = time.perf_counter() - start
    for line in report.summary(run_info):
        out(line)
    if cost_chips:
        modelled = cost_columns.rows(pairs, cost_chips)
        run_info["cost_model"] = [r.as_dict() for r in modelled]
        for line in cost_columns.lines(modelled):
            out(line)
        if plots and modelled:
            drawn = cost_plot.plot(modelled, os.path.join(plots, "cost_model.png"))
            out(f"cost model plot: {drawn or 'nothing modelled'}")
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(run_info, f, indent=1, default=str)
        out(f"results: {json_path}")
    if plots and run_info["results"]:
        files = report.plot(run_info, plots)
        out(f"plots: {', '.join(files)}" if files else "plots: nothing to plot")
    return run_info


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kernel", help="kernel name(s), comma-separated (mm, flash_attention, ...)")
    p.add_argument("--shape", help="substring of the case label, e.g. m128 or vocab32000")
    p.add_argument("--dtype", help="float32 | bfloat16 (f32 | bf16)")
    p.add_argument("--impl", help="impl kinds or labels, comma-separated: xla,pallas,cpu,pallas:mm")
    p.add_argument("--quick", action="store_true", help="only the small cases (CI smoke run)")
    p.add_argument("--interpret", action="store_true",
                   help="off TPU, also run Pallas/Helion kernels in interpret mode (correctness only)")
    p.add_argument("--json", dest="json_path", default=RESULTS, metavar="PATH",
                   help=f"results file (default {RESULTS}, read by the coverage report)")
    p.add_argument("--no-json", dest="json_path", action="store_const", const=None)
    p.add_argument("--plots", default=PLOTS, metavar="DIR", help=f"PNG directory (default {PLOTS})")
    p.add_argument("--no-plots", dest="plots", action="store_const", const=None)
    p.add_argument("--compare", metavar="FILE", help="earlier JSON run: show new/old time ratios")
    p.add_argument("--warmup", type=int)
    p.add_argument("--iters", type=int)
    p.add_argument("--list", action="store_true", help="list kernels and cases, run nothing")
    p.add_argument("--cost-model", metavar="CHIPS", nargs="?", const=",".join(CHECKED_GENERATIONS),
                   help="also each kernel's modelled time, XLA's estimate, their ratio and the roofline "
                        "fraction per chip (default chips: %(const)s)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tpu_kernels bench", description=__doc__.split("\n")[0])
    add_arguments(p)
    return main_args(p.parse_args(argv))


def main_args(a: argparse.Namespace) -> int:
    if a.list:
        for b, c in select(load_benchmarks(), a.kernel, a.shape, a.dtype, a.quick):
            print(f"{b.name:<26} {b.op:<55} {c.label:<40} {str(c.dtype)[6:]:<9}"
                  f"{' quick' if c.quick else ''}")
        return 0
    info = run(kernel=a.kernel, shape=a.shape, dtype=a.dtype, impl=a.impl, quick=a.quick,
               interpret=a.interpret, json_path=a.json_path, plots=a.plots, compare=a.compare,
               warmup=a.warmup, iters=a.iters,
               cost_chips=[c for c in a.cost_model.split(",") if c] if a.cost_model else None)
    bad = [r for r in info["results"] if r["status"] == "error" or
           (r.get("check") or {}).get("ok") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
