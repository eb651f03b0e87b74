"""``python -m tpu_kernels tune KERNEL --chip v5e|v6e|v7x [--shapes ...] [--write]``:
search a kernel's block sizes per (chip, shape class) and write its tuned table.

For each shape class, at the class's representative shape (its power-of-two buckets):

1. enumerate the candidates (``tunables``) whose VMEM estimate the scoped limit can be
   raised for;
2. score each: the cost model's time (``registry.costs.kernel_model``: flops and HBM
   bytes its grid moves, padding and re-fetches included, plus a cost per grid step) plus
   the pipeline's fill and drain, which the model does not see and big blocks pay (the
   first blocks load before any compute, the last output block stores after it: their
   bytes at HBM bandwidth). Among candidates within ``TOLERANCE`` of the best score the
   smaller VMEM footprint comes first (room for XLA's fusions around the kernel);
3. compile them in that order for the chip with the real compiler (libtpu compile-only,
   ``tpu_kernels.aot``) until ``keep`` compile and their compiled VMEM fits the chip;
4. on a TPU, time the survivors (median of runs) and keep the fastest; elsewhere the
   first survivor wins.

The entry records the choice, its modelled time, the heuristic's choice and modelled time
at the same shape, the compiled VMEM, and how the choice was made (``basis``).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels.aot import tunables
from tpu_kernels.aot.compiler import compile as aot_compile
from tpu_kernels.aot.compiler import explain
from tpu_kernels.pallas import tpu_info, tuned
from tpu_kernels.registry.costs import kernel_model

# Candidates within this share of the best modelled time count as equally fast.
TOLERANCE = 0.03
_REJECTS_KEPT = 3


@dataclasses.dataclass
class Outcome:
    """One (kernel, chip, class) search."""
    chip: str
    shape_class: str
    entry: dict | None          # None: nothing compiled
    lines: list[str]


def _modelled(t: tunables.Tunable, dtype: Any, dims: dict, c: tuple, chip: str) -> float:
    fn, specs = t.program(dtype, dims, c)
    return kernel_model.model(fn, specs, chip).seconds


def score(t: tunables.Tunable, dtype: Any, dims: dict, c: tuple, chip: tpu_info.Chip) -> float:
    """Modelled seconds plus the pipeline's exposed fill and drain."""
    return _modelled(t, dtype, dims, c, chip.name) + t.exposed(dtype, dims, c) / chip.hbm_bytes_per_s


def rank(t: tunables.Tunable, dtype: Any, dims: dict, chip: tpu_info.Chip) -> list[tuple[tuple, float]]:
    """Legal candidates with their scores (seconds), in the order they are tried."""
    scored = [(c, score(t, dtype, dims, c, chip)) for c in t.legal(dtype, dims, chip)]
    if not scored:
        return []
    best = min(s for _, s in scored)
    near = lambda s: s <= best * (1 + TOLERANCE)  # noqa: E731
    return sorted(scored, key=lambda cs: (not near(cs[1]),
                                          t.vmem(dtype, dims, cs[0]) if near(cs[1]) else cs[1], cs[1]))


def _time_on_tpu(fn: Callable[..., Any], specs: list, runs: int = 5) -> float:
    """Median seconds of ``fn`` on the attached TPU (random inputs, one warm-up)."""
    key = jax.random.PRNGKey(0)
    args = [jax.random.normal(key, s.shape, jnp.float32).astype(s.dtype) for s in specs]
    jitted = jax.jit(fn)
    jax.block_until_ready(jitted(*args))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(jitted(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def search(t: tunables.Tunable, chip: str, shape_cls: str, keep: int | None = None,
           progress: Callable[[str], None] = lambda s: None) -> Outcome:
    """Tune ``t`` for ``chip`` at ``shape_cls``'s representative shape."""
    row = tpu_info.chip(chip)
    dtype_name, dims = tuned.representative(shape_cls)
    dtype = jnp.dtype(dtype_name)
    on_tpu = tpu_info.on_tpu() and tpu_info.device_chip() == row
    keep = keep or (3 if on_tpu else 1)
    start = time.perf_counter()
    order = rank(t, dtype, dims, row)
    progress(f"  {len(order)} legal candidates modelled in {time.perf_counter() - start:.1f} s")
    survivors, rejects, compiled = [], [], 0
    cap = row.vmem_bytes
    for c, seconds in order:
        if len(survivors) >= keep:
            break
        fn, specs = t.program(dtype, dims, c)
        t0 = time.perf_counter()
        compiled += 1
        try:
            vmem = aot_compile(fn, *specs, chip=row.name).summary.max_kernel_vmem
        except Exception as exc:  # noqa: BLE001  (a compile failure rejects the candidate)
            rejects.append(f"{c}: {explain(exc)}")
            progress(f"  {c} scored {seconds * 1e6:.1f} us: FAIL {explain(exc)}")
            continue
        if vmem is not None and vmem > cap * 3 // 4:
            rejects.append(f"{c}: compiled VMEM {vmem} > 3/4 of {cap}")
            continue
        progress(f"  {c} scored {seconds * 1e6:.1f} us: ok, VMEM "
                 f"{(vmem or 0) / tpu_info.MiB:.1f} MiB ({time.perf_counter() - t0:.1f} s)")
        survivors.append((c, seconds, vmem, _time_on_tpu(fn, specs) if on_tpu else None))
    if not survivors:
        return Outcome(row.name, shape_cls, None, [f"no candidate compiled ({compiled} tried)"] + rejects)
    best = min(survivors, key=lambda s: s[3]) if on_tpu else survivors[0]
    c, seconds, vmem, measured = best
    with tuned.heuristics_only(), tpu_info.compile_for(row):
        heur = tuple(t.heuristic(dtype, dims, row))
    entry = {**dict(zip(t.params, c)), "basis": "measured" if on_tpu else "compiled+modelled",
             "modelled_s": _modelled(t, dtype, dims, c, row.name), "score_s": seconds,
             "vmem_bytes": vmem, "vmem_estimate": t.vmem(dtype, dims, c),
             "heuristic": list(heur), "heuristic_modelled_s": _modelled(t, dtype, dims, heur, row.name),
             "heuristic_score_s": score(t, dtype, dims, heur, row),
             "candidates": len(order), "compiled": compiled, "rejected": rejects[:_REJECTS_KEPT]}
    if measured is not None:
        entry["measured_s"] = measured
    return Outcome(row.name, shape_cls, entry, [])


def run(kernel: str, chips: list[str], classes: list[str] | None = None, write: bool = False,
        keep: int | None = None, progress: Callable[[str], None] = lambda s: None) -> list[Outcome]:
    """Tune ``kernel`` per chip and class; with ``write``, merge the results into its table."""
    t = tunables.get(kernel)
    todo = [(chip, cls) for chip in chips for cls in (classes or t.classes)]
    outcomes = []
    for i, (chip, cls) in enumerate(todo, 1):
        progress(f"[{i}/{len(todo)}] {kernel} {tpu_info.chip(chip).name} {cls}")
        out = search(t, chip, cls, keep, progress)
        outcomes.append(out)
        progress("  -> " + _summary(t, out))
        if write and out.entry is not None:      # written as it goes: a long run keeps its work
            tuned.write(t.kernel, list(t.params), {tuned.key(out.chip, cls): out.entry})
    return outcomes


def _summary(t: tunables.Tunable, out: Outcome) -> str:
    e = out.entry
    if e is None:
        return "; ".join(out.lines)
    c = tuple(e[p] for p in t.params)
    gain = e["heuristic_score_s"] / e["score_s"] if e["score_s"] else float("nan")
    return (f"{c} {e['score_s'] * 1e6:.1f} us scored (heuristic {tuple(e['heuristic'])} "
            f"{e['heuristic_score_s'] * 1e6:.1f} us: {gain:.2f}x)")


def parse_classes(text: str, dtype: str) -> list[str]:
    """``"m=1024,n=4096,k=4096;m=8192,n=4096,k=4096"`` -> shape classes of ``dtype``."""
    out = []
    for part in filter(None, (p.strip() for p in text.replace(" ", ";").split(";"))):
        dims = {k: int(v) for k, v in (kv.split("=") for kv in part.split(","))}
        out.append(tuned.shape_class(np.dtype(jnp.dtype(dtype)), **dims))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kernel", choices=sorted(tunables.TUNABLES))
    parser.add_argument("--chip", default=",".join(tpu_info.CHECKED_GENERATIONS),
                        help="chip(s), comma-separated (default: the checked generations)")
    parser.add_argument("--shapes", default="",
                        help="shape classes as dims, e.g. 'm=1024,n=4096,k=4096;m=512,n=1024,k=4096' "
                             "(flash_attention: sq,skv,d; cross_entropy: n,v); default: the kernel's classes")
    parser.add_argument("--dtype", default="bfloat16", help="dtype of --shapes (default bfloat16)")
    parser.add_argument("--keep", type=int, default=None,
                        help="candidates to compile successfully per class (default 1; 3 on a TPU, then timed)")
    parser.add_argument("--write", action="store_true", help="merge the results into the shipped table")


def main_args(args: argparse.Namespace) -> int:
    chips = [tpu_info.chip(c).name for c in args.chip.split(",") if c]
    classes = parse_classes(args.shapes, args.dtype) if args.shapes else None
    t = tunables.get(args.kernel)
    outcomes = run(args.kernel, chips, classes, args.write, args.keep, progress=lambda s: print(s, flush=True))
    print(f"\n| chip | class | {' | '.join(t.params)} | score | heuristic | score | gain | VMEM |")
    print("|---" * (len(t.params) + 7) + "|")
    for o in outcomes:
        e = o.entry
        if e is None:
            print(f"| {o.chip} | {o.shape_class} | " + " | ".join(["-"] * (len(t.params) + 5)) + " |")
            continue
        print(f"| {o.chip} | {o.shape_class} | " + " | ".join(str(e[p]) for p in t.params)
              + f" | {e['score_s'] * 1e6:.1f} us | {tuple(e['heuristic'])} | {e['heuristic_score_s'] * 1e6:.1f} us"
              f" | {e['heuristic_score_s'] / e['score_s']:.2f}x | {(e['vmem_bytes'] or 0) / tpu_info.MiB:.1f} MiB |")
    if args.write:
        print(f"\nwritten: {tuned.path(t.kernel)}")
    return 0 if all(o.entry is not None for o in outcomes) else 1
