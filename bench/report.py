"""Terminal table, summary, comparison and plots for ``python -m tpu_kernels bench`` runs."""
from __future__ import annotations

import json
import math
import os
from typing import Any

REGRESSION = 1.2   # new/old median above this is flagged by --compare


def short_dtype(dtype: Any) -> str:
    s = str(dtype).replace("torch.", "")
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(s, s)


def _si(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    for scale, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{p}{unit}"
    return f"{x:.3g}{unit}"


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.3f}" if x < 1 else f"{x * 1e3:.0f}"


def header(run: dict) -> list[str]:
    dp, cp = run["device_peak"], run["cpu_peak"]
    return [
        f"tpu_kernels bench  {run['date']}  device {run['device']}  torch {run['torch']}  jax {run['jax']}",
        f"device peak: {dp['name']} {_si(dp['flops'], 'FLOP/s')} {_si(dp['bytes_per_s'], 'B/s')} "
        f"({dp['source']}{': ' + dp['note'] if dp.get('note') else ''})",
        f"CPU peak:    {cp['name']} {_si(cp['flops'], 'FLOP/s')} {_si(cp['bytes_per_s'], 'B/s')} "
        f"({cp['source']}: {cp['note']})",
        f"note: {run['note']}",
        "%peak = achieved / roofline bound min(peak FLOP/s, intensity x peak B/s) of the device the "
        "row ran on (small cases run from cache and can exceed 100% of the measured DRAM bandwidth; "
        "the CPU peak is the best of a few runs on a possibly shared machine); xCPU = torch_cpu median / row median (>1: faster than torch on the CPU).",
        "",
    ]


_COLS = (("kernel", 22), ("case", 34), ("dt", 4), ("impl", 24), ("median ms", 10), ("min ms", 9),
         ("max ms", 9), ("compile ms", 10), ("FLOP/s", 8), ("B/s", 8), ("%peak", 6), ("xCPU", 6),
         ("check", 9))


def table_header(compare: bool = False) -> str:
    cols = [f"{n:<{w}}" if i < 4 else f"{n:>{w}}" for i, (n, w) in enumerate(_COLS)]
    if compare:
        cols.append(f"{'new/old':>8}")
    line = " ".join(cols)
    return line + "\n" + "-" * len(line)


def _check(r: dict) -> str:
    c = r.get("check")
    if not c:
        return "-"
    if c.get("ok") is None:
        return "no ref"
    if "rel_err" in c:
        return ("ok " if c["ok"] else "BAD ") + f"{c['rel_err']:.0e}"
    return "BAD"


def table_row(r: dict, compare: bool = False) -> str:
    case = r["case"] if len(r["case"]) <= 34 else r["case"][:31] + "..."
    lead = [f"{r['kernel'][:22]:<22}", f"{case:<34}", f"{short_dtype(r['dtype']):<4}",
            f"{r['impl'][:24]:<24}"]
    if r["status"] != "ok":
        return " ".join(lead) + f" {r['status'].upper()}: {r.get('reason', '')}"
    if r.get("mode") == "interpret":
        return " ".join(lead) + (f" {'(interpret mode: correctness only, not speed)':>56} "
                                 f"{'':>30} {_check(r):>9}")
    frac = r.get("peak_fraction")
    cells = [_ms(r["median_s"]), _ms(r["min_s"]), _ms(r["max_s"]), _ms(r["compile_s"]),
             _si(r.get("flop_s")) if r["flops"] else "-", _si(r.get("bytes_s")),
             f"{frac * 100:.1f}" if frac is not None else "-",
             f"{r['speedup_vs_cpu']:.2f}" if r.get("speedup_vs_cpu") else "-", _check(r)]
    widths = [w for _, w in _COLS[4:]]
    line = " ".join(lead + [f"{c:>{w}}" for c, w in zip(cells, widths)])
    if compare:
        ratio = r.get("compare_ratio")
        flag = " !" if ratio and ratio > REGRESSION else ""
        line += f" {f'{ratio:.2f}' if ratio else 'new':>8}{flag}"
    return line


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def xla_vs_cpu(run: dict) -> dict[str, dict]:
    """Per kernel: geometric mean (and range) of torch_cpu median / XLA median."""
    per: dict[str, list[float]] = {}
    per_min: dict[str, list[float]] = {}
    cpu = {(r["kernel"], r["case"], r["dtype"]): r for r in run["results"]
           if r["kind"] == "torch_cpu" and r.get("min_s")}
    for r in run["results"]:
        if r["kind"] == "xla" and r.get("speedup_vs_cpu"):
            per.setdefault(r["kernel"], []).append(r["speedup_vs_cpu"])
            c = cpu.get((r["kernel"], r["case"], r["dtype"]))
            if c:
                per_min.setdefault(r["kernel"], []).append(c["min_s"] / r["min_s"])
    return {k: {"geomean": _geomean(v), "min": min(v), "max": max(v), "cases": len(v),
                "geomean_of_min_times": _geomean(per_min[k]) if per_min.get(k) else None}
            for k, v in per.items()}


def summary(run: dict) -> list[str]:
    rs = run["results"]
    lines = ["", f"{len(rs)} rows in {run.get('elapsed_s', 0):.1f}s: "
             f"{sum(r['status'] == 'ok' for r in rs)} ok, "
             f"{sum(r['status'] == 'skipped' for r in rs)} skipped, "
             f"{sum(r['status'] == 'error' for r in rs)} errors, "
             f"{sum((r.get('check') or {}).get('ok') is False for r in rs)} failed checks"]
    ratios = xla_vs_cpu(run)
    if ratios:
        lines.append("XLA lowering vs torch CPU (torch_cpu time / xla time; >1 = XLA faster; medians, "
                     "and min times, which a shared machine disturbs less):")
        for k, v in ratios.items():
            mins = v["geomean_of_min_times"]
            lines.append(f"  {k:<26} x{v['geomean']:.2f} (geomean of {v['cases']}; "
                         f"range {v['min']:.2f}-{v['max']:.2f})"
                         + (f"  min-time ratio x{mins:.2f}" if mins else ""))
    comp = [r for r in rs if r.get("compare_ratio")]
    if comp:
        worse = [r for r in comp if r["compare_ratio"] > REGRESSION]
        lines.append(f"vs earlier run: geomean new/old {_geomean([r['compare_ratio'] for r in comp]):.2f} "
                     f"over {len(comp)} rows; {len(worse)} slower by more than {REGRESSION}x"
                     + "".join(f"\n  slower: {r['kernel']} {r['case']} {r['impl']} x{r['compare_ratio']:.2f}"
                               for r in worse))
    return lines


# -- comparing runs ----------------------------------------------------------------------------------
def load(path: str) -> dict:
    with open(path) as f:
        run = json.load(f)
    if not isinstance(run, dict) or "results" not in run:
        raise SystemExit(f"bench --compare: {path} is not a bench JSON run")
    return run


def _key(r: dict) -> tuple:
    return (r["kernel"], r["case"], r["dtype"], r["impl"])


def attach_compare(r: dict, previous: dict) -> None:
    index = previous.setdefault("_index", {_key(p): p for p in previous["results"]})
    old = index.get(_key(r))
    if (old and old.get("median_s") and r.get("median_s") and r.get("mode") != "interpret"
            and old.get("mode") != "interpret"):
        r["compare_ratio"] = r["median_s"] / old["median_s"]


# -- plots -------------------------------------------------------------------------------------------
_MARKERS = {"pallas": "s", "helion": "D", "xla": "o", "user": "^", "torch_cpu": "x"}


def plot(run: dict, directory: str) -> list[str]:
    """Per kernel: median time per impl across cases; one roofline chart. Returns paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    timed = [r for r in run["results"] if r["status"] == "ok" and r.get("mode") != "interpret"
             and r.get("median_s")]
    files = []
    kernels = sorted({r["kernel"] for r in timed})
    for k in kernels:
        rows = [r for r in timed if r["kernel"] == k]
        cases = list(dict.fromkeys(f"{r['case']} {short_dtype(r['dtype'])}" for r in rows))
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cases) + 3), 4))
        for impl in dict.fromkeys(r["impl"] for r in rows):
            pts = [(cases.index(f"{r['case']} {short_dtype(r['dtype'])}"), r["median_s"] * 1e3)
                   for r in rows if r["impl"] == impl]
            kind = next(r["kind"] for r in rows if r["impl"] == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=_MARKERS.get(kind, "o"),
                    label=impl, linestyle="-" if len(pts) > 1 else "none")
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(cases, rotation=30, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("median ms (log)")
        ax.set_title(f"{k}: time per impl ({run['device']}; {run['date'][:10]})")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(directory, f"{k}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        files.append(path)

    pts = [r for r in timed if r["flops"] > 0 and r["bytes"] > 0]
    if pts:
        fig, ax = plt.subplots(figsize=(8, 5.5))
        for name, peak, style in (("device", run["device_peak"], "-"), ("cpu", run["cpu_peak"], "--")):
            xs = [10 ** (e / 4) for e in range(-8, 21)]
            ax.plot(xs, [min(peak["flops"], x * peak["bytes_per_s"]) for x in xs], style, color="gray",
                    label=f"roofline {peak['name']}")
            if run["device_peak"] == run["cpu_peak"]:
                break
        cmap = plt.get_cmap("tab10")
        colors = {k: cmap(i % 10) for i, k in enumerate(sorted({r["kernel"] for r in pts}))}
        seen = set()
        for r in pts:
            lab = r["kernel"] if r["kernel"] not in seen else None
            seen.add(r["kernel"])
            ax.scatter(r["flops"] / r["bytes"], r["flop_s"], color=colors[r["kernel"]],
                       marker=_MARKERS.get(r["kind"], "o"), label=lab, s=28)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte)")
        ax.set_ylabel("achieved FLOP/s")
        ax.set_title(f"roofline: every kernel x case x impl (marker = impl kind: o xla, s pallas, "
                     f"x torch cpu)\n{run['device']}; {run['date'][:10]}", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = os.path.join(directory, "roofline.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        files.append(path)
    return files
