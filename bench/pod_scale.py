"""Pod-scale training steps proven by the real TPU compiler (libtpu compile-only slices),
at the depths that compile on this machine, scaled to full depth, as a markdown page.

    python -m tpu_kernels.bench.pod_scale --depths 1,2,4 -o docs/reports/pod_scale.md
    python -m tpu_kernels.bench.pod_scale --cases llama3-8b@v5e:16x16 --depths 2

Each case is ``python -m tpu_kernels aot --model M --layers L --mesh ... --topology ...
--json`` run in its own process (its wall clock and peak RSS are recorded; each result is
kept in ``--keep`` as JSON, so a long run can be resumed and a report rebuilt with
``--report-only``). From the two deepest depths L1 < L2 compiled, every per-chip figure f (HBM
arguments, outputs, temporaries, collective bytes per kind, XLA's step estimate) is scaled
to the model's full depth N as f(L2) + (N - L2) * (f(L2) - f(L1)) / (L2 - L1): the layers
are identical, so each adds the same; the figures so obtained are labelled *scaled*. MFU
takes the full model's FLOPs (counted on the meta device) over the scaled step.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import math
import subprocess
import sys
import time

import torch

from tpu_kernels.aot import collectives, configs, summary
from tpu_kernels.aot.configs import model_flops_per_token
from tpu_kernels.pallas import tpu_info

GiB, MiB = tpu_info.GiB, tpu_info.MiB
# (model, topology, mesh): Llama-3-8B with FSDP x TP, Qwen3-30B-A3B with FSDP x EP
CASES = {
    "llama3-8b@v5e:16x16": ("llama3-8b", "v5e:16x16", "fsdp=64,tp=4"),
    "llama3-8b@v6e:8x8": ("llama3-8b", "v6e:8x8", "fsdp=16,tp=4"),
    "qwen3-moe-30b@v5e:16x16": ("qwen3-moe-30b", "v5e:16x16", "fsdp=64,ep=4"),
    "qwen3-moe-30b@v6e:8x8": ("qwen3-moe-30b", "v6e:8x8", "fsdp=16,ep=4"),
    # the same with each decoder layer checkpointed (``aot --remat``)
    "llama3-8b@v5e:16x16+remat": ("llama3-8b", "v5e:16x16", "fsdp=64,tp=4"),
    "qwen3-moe-30b@v6e:8x8+remat": ("qwen3-moe-30b", "v6e:8x8", "fsdp=16,ep=4"),
}
LINEAR = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "step_seconds",
          "overlapped_bytes")


def compile_case(case: str, layers: int, keep: str, timeout: int) -> dict | None:
    """Compile one case at ``layers`` in a child process; its JSON (with wall clock and
    peak RSS), also written to ``keep``; None if it failed or timed out."""
    model, topo, mesh = CASES[case]
    path = os.path.join(keep, f"{case.replace(':', '_')}-L{layers}.json")
    os.makedirs(keep, exist_ok=True)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    cmd = [sys.executable, "-m", "tpu_kernels", "aot", "--model", model, "--layers",
           str(layers), "--mesh", mesh, "--topology", topo, "--json",
           "--hlo", os.path.join(keep, f"{case.replace(':', '_')}-L{layers}.hlo")]
    cmd += ["--remat"] if case.endswith("+remat") else []
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"{case} L{layers}: timed out after {timeout} s", file=sys.stderr)
        return None
    # 1: compiled, does not fit (with its JSON); an exception also exits 1, without it
    if p.returncode not in (0, 1) or not p.stdout.strip():
        print(f"{case} L{layers} failed:\n{p.stderr[-3000:]}", file=sys.stderr)
        return None
    out = json.loads(p.stdout)
    out.update(layers=layers, wall_seconds=time.perf_counter() - t0)
    os.makedirs(keep, exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return out


@dataclasses.dataclass
class FullModel:
    layers: int
    params: int
    flops_per_step: float     # all chips together


def full_model(name: str, tokens: int) -> FullModel:
    """The full-depth model's size and FLOPs, from the model built on the meta device."""
    spec = configs.BUNDLED[name]()
    with torch.device("meta"):
        model = spec.build()
    return FullModel(model.config.num_hidden_layers, sum(p.numel() for p in model.parameters()),
                     model_flops_per_token(spec, model) * tokens)


def scaled(lo: dict, hi: dict, layers: int) -> dict:
    """``hi``'s per-chip figures scaled from its depth to ``layers`` (per layer: the
    difference between ``hi`` and ``lo`` over their depth difference)."""
    k = (layers - hi["layers"]) / (hi["layers"] - lo["layers"])
    # a figure that fell with depth (XLA scheduled the deeper program tighter) is not
    # extrapolated downwards: it keeps ``hi``'s value, a lower bound (``shrunk`` names it)
    out = {f: hi[f] + k * max(hi[f] - lo[f], 0) for f in LINEAR}
    out["shrunk"] = [f for f in LINEAR if hi[f] < lo[f]]
    out["collectives"] = {
        kind: {q: c[q] + k * (c[q] - lo["collectives"].get(kind, {}).get(q, 0))
               for q in ("count", "bytes")}
        for kind, c in hi["collectives"].items()}
    return out


def _with_derived(r: dict, chips: int, chip: str, model_flops: float) -> dict:
    r = dict(r)
    r["peak_hbm_bytes"] = r["argument_bytes"] + r["output_bytes"] - r["alias_bytes"] + r["temp_bytes"]
    r["mfu"] = model_flops / (r["step_seconds"] * tpu_info.chip(chip).bf16_flops * chips)
    total = sum(c["bytes"] for c in r["collectives"].values())
    r["overlapped_fraction"] = r["overlapped_bytes"] / total if total else 0.0
    r["collective_bytes"] = total
    return r


def _row(label: str, r: dict, chip: str) -> str:
    hbm = tpu_info.chip(chip).hbm_bytes
    comms = ", ".join(f"{k} {c['count']:.0f} ({c['bytes'] / MiB:,.0f} MiB)"
                      for k, c in sorted(r["collectives"].items()))
    fits = "fits" if r["peak_hbm_bytes"] <= hbm else "**does not fit**"
    return (f"| {label} | {r['argument_bytes'] / GiB:.2f} | {r['temp_bytes'] / GiB:.2f} | "
            f"{r['peak_hbm_bytes'] / GiB:.2f} of {hbm / GiB:.0f} ({fits}) | {comms} | "
            f"{r['collective_bytes'] / GiB:.2f} | {r['overlapped_fraction']:.0%} | "
            f"{r['step_seconds'] * 1e3:,.1f} | {r['mfu']:.1%} |")


HEADER = ["| depth | args GiB | temps GiB | peak HBM GiB per chip | collectives per chip "
          "(count, bytes) | collective GiB | overlapped | XLA est. ms/step | MFU |",
          "|---|---|---|---|---|---|---|---|---|"]


def case_section(case: str, results: list[dict]) -> list[str]:
    model, topo, mesh = CASES[case]
    chip = tpu_info.chip(topo.partition(":")[0]).name
    remat = ", each decoder layer checkpointed (`--remat`)" if case.endswith("+remat") else ""
    if not results:
        return [f"## {model} on {topo} (mesh {mesh}{remat})", "",
                f"Not compiled: no result kept for this case (`python -m tpu_kernels aot "
                f"--model {model} --layers 1 --mesh {mesh} --topology {topo}"
                + (" --remat" if remat else "") + "`).", ""]
    chips = math.prod(results[0]["mesh"].values())
    full = full_model(model, results[0]["tokens"])
    out = [f"## {model} on {topo} ({chips} chips, mesh {mesh}{remat})", "",
           f"Full model: {full.layers} layers, {full.params / 1e9:.2f} B parameters; "
           f"{results[0]['tokens']} tokens per step (one 4096-token sequence per data shard); "
           f"{full.flops_per_step:.3g} model FLOPs per step.", "", *HEADER]
    for r in results:
        flops = r["model_flops"]
        out.append(_row(f"{r['layers']} (compiled)", _with_derived(r, chips, chip, flops), chip))
    if len(results) >= 2:
        lo, hi = results[-2], results[-1]
        s = dict(scaled(lo, hi, full.layers))
        bound = ", temps a lower bound" if "temp_bytes" in s["shrunk"] else ""
        out.append(_row(f"**{full.layers} (scaled{bound})**",
                        _with_derived(s, chips, chip, full.flops_per_step), chip))
        if s["shrunk"]:
            out += ["", f"Fell from {lo['layers']} to {hi['layers']} layers, so kept at the "
                    f"{hi['layers']}-layer value in the scaled row (a lower bound): "
                    + ", ".join(_change(f, lo[f], hi[f]) for f in s["shrunk"]) + "."]
    out.append("")
    out += overlap_lines(results)
    out.append("Compile: " + "; ".join(
        f"{r['layers']} layers {r['compile_seconds']:.0f} s compile, {r['wall_seconds']:.0f} s "
        f"wall" + (f" ({r['cpu_seconds']:.0f} s of CPU)" if "cpu_seconds" in r else "") +
        f", peak RSS {r['max_rss_bytes'] / GiB:.1f} GiB" for r in results) + ".")
    out.append("")
    return out


def _change(field: str, lo: float, hi: float) -> str:
    if field == "step_seconds":
        return f"{field} {lo * 1e3:,.1f} → {hi * 1e3:,.1f} ms"
    return f"{field} {lo / GiB:.2f} → {hi / GiB:.2f} GiB"


def overlap_lines(results: list[dict]) -> list[str]:
    """Where the collective bytes of the deepest compile that says so go: in flight while
    compute runs, async with nothing scheduled in between, or synchronous."""
    r = next((r for r in reversed(results) if "overlap_by_kind" in r), None)
    if r is None:
        return []
    parts = [f"{kind}: {v['overlapped'] / MiB:,.0f} MiB overlapped, "
             f"{v['async_idle'] / MiB:,.0f} MiB async with no compute between start and done, "
             f"{v['synchronous'] / MiB:,.0f} MiB synchronous"
             for kind, v in sorted(r["overlap_by_kind"].items())]
    how = {True: "with the async-collective options (`aot.overlap`)",
           False: "with libtpu's default scheduling (`--sync-collectives`)"}.get(
        r.get("async_collectives"), "with libtpu's default scheduling, counted before "
        "`aot.collectives` read async collective fusions")
    return [f"Overlap at {r['layers']} layers (compiled {how}): " + "; ".join(parts) + ".", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"of {sorted(CASES)}")
    parser.add_argument("--depths", default="1,2", help="layer counts to compile, ascending")
    parser.add_argument("--keep", default="bench/results/pod_scale", help="per-compile JSON")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per compile")
    parser.add_argument("--report-only", action="store_true", help="only what --keep holds")
    parser.add_argument("--reanalyse", action="store_true",
                        help="recount the collectives of kept results from their kept HLO first")
    parser.add_argument("-o", "--output", default=None, help="markdown file (default stdout)")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    if args.reanalyse:
        for path in reanalyse(args.keep):
            print(f"recounted the collectives of {path}", file=sys.stderr)
    lines = [f"# Pod-scale training steps (libtpu {importlib.metadata.version('libtpu')}, "
             f"{datetime.date.today()})", ""]
    for case in filter(None, args.cases.split(",")):
        results = []
        for d in depths:
            r = (_kept(case, d, args.keep) if args.report_only
                 else compile_case(case, d, args.keep, args.timeout))
            if r is not None:
                results.append(r)
        lines += case_section(case, results)
    text = "\n".join(lines)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


def reanalyse(keep: str) -> list[str]:
    """Recount the collective fields of each kept result that has its optimised HLO beside
    it (``aot.collectives`` as it is now) and redo its step estimate's correction for
    uncosted custom calls (``aot.summary.uncosted_seconds`` as it is now); the JSON files
    it rewrote."""
    done = []
    for name in sorted(os.listdir(keep)):
        path = os.path.join(keep, name)
        hlo = path.removesuffix(".json") + ".hlo"
        if not name.endswith(".json") or not os.path.exists(hlo):
            continue
        with open(hlo) as f:
            text = f.read()
        comms = collectives.analyse(text)
        with open(path) as f:
            r = json.load(f)
        raw = r["step_seconds"] - r.get("uncosted_seconds", _added_before(text))
        r["uncosted_seconds"] = summary.uncosted_seconds(text, raw)
        r["step_seconds"] = raw + r["uncosted_seconds"]
        r.update(collectives={k: dict(count=n, bytes=b) for k, (n, b) in comms.by_kind().items()},
                 overlapped_fraction=comms.overlapped_fraction, overlapped_bytes=comms.overlapped_bytes,
                 overlap_by_kind=comms.overlap_by_kind())
        with open(path, "w") as f:
            json.dump(r, f, indent=1)
        done.append(path)
    return done


def _added_before(hlo_text: str) -> int:
    """The correction results kept before ``uncosted_seconds`` was recorded had: one second
    per uncosted call anywhere, PrepareAsyncCall pairs in the entry computation only."""
    every = summary._TARGET.findall(hlo_text)
    entry = summary._TARGET.findall(summary._entry(hlo_text))
    return (sum(t in summary._UNCOSTED - summary._ENTRY_ONLY for t in every)
            + sum(t in summary._ENTRY_ONLY for t in entry))


def _kept(case: str, layers: int, keep: str) -> dict | None:
    path = os.path.join(keep, f"{case.replace(':', '_')}-L{layers}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


if __name__ == "__main__":
    main()
