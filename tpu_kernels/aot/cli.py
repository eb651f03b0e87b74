"""``python -m tpu_kernels aot``: compile for a TPU chip on this machine and report.

    python -m tpu_kernels aot --model tpu_kernels.aot.configs:llama_small --chip v6e
    python -m tpu_kernels aot --model llama3-8b --chip v5e,v6e,v7x
    python -m tpu_kernels aot --kernels --chip v5e,v6e,v7x
    python -m tpu_kernels aot --model llama3-8b --mesh fsdp=64,tp=4 --topology v5e:16x16

``--model`` compiles one training step (the model's ``torch.compile(backend="tpu")``
forward and backward graphs and the fused AdamW step) and prints HBM, the Mosaic kernels
inside, XLA's estimated step time and the MFU it implies. ``--kernels`` compiles every
Pallas and Helion kernel at production shapes and prints the kernel x chip table.
``--mesh`` with ``--topology`` compiles the training step as one SPMD program over every
chip of a pod slice (``tpu_kernels.aot.pod``): per-chip HBM, collectives, estimate, MFU.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys

from tpu_kernels.pallas import tpu_info
from tpu_kernels.aot import pod, topology
from tpu_kernels.aot.check import check_kernels, table
from tpu_kernels.aot.training import compile_model, load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", metavar="MODULE:FACTORY",
                      help="a factory returning a tpu_kernels.aot.configs.ModelSpec, or one "
                           "of: gpt, llama-small, qwen3-moe-small, llama3-8b")
    what.add_argument("--kernels", action="store_true",
                      help="every Pallas/Helion kernel at production shapes")
    parser.add_argument("--chip", default="v6e",
                        help=f"chip(s), comma-separated, of {sorted(tpu_info.CHIPS)} "
                             "(default v6e)")
    parser.add_argument("--thorough", action="store_true",
                        help="with --kernels: the longer list of kernel cases too")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--mesh", metavar="AXIS=N,...",
                        help="with --model and --topology: the device mesh, e.g. fsdp=64,tp=4 "
                             "(axes fsdp, dp: data and FSDP; tp: tensor; ep: experts)")
    parser.add_argument("--topology", metavar="CHIP:SHAPE",
                        help="with --mesh: a pod slice, e.g. v5e:16x16, v6e:8x8")
    parser.add_argument("--batch", type=int, default=None,
                        help="with --mesh: global batch (default: one sequence per data shard)")
    parser.add_argument("--hlo", metavar="PATH", default=None,
                        help="with --mesh: write the compiled step's optimised HLO there")
    parser.add_argument("--layers", type=int, default=None,
                        help="with --mesh: build the model with this many decoder layers "
                             "(time a pod compile at small depth before the full one)")
    parser.add_argument("--remat", action="store_true",
                        help="with --mesh: checkpoint each decoder layer (the backward "
                             "recomputes its activations: less HBM, more FLOPs)")
    parser.add_argument("--sync-collectives", action="store_true",
                        help="with --mesh: compile with libtpu's default collective "
                             "scheduling, without the async-collective options "
                             "(tpu_kernels.aot.overlap)")


def main_args(args: argparse.Namespace) -> int:
    reason = topology.unavailable_reason()
    if reason:
        print(f"aot: {reason}", file=sys.stderr)
        return 2
    chips = [tpu_info.chip(c).name for c in args.chip.split(",") if c]
    if args.kernels:
        return _kernels(chips, args)
    if args.mesh or args.topology:
        return _pod(args)
    return _model(args.model, chips, args)


def _pod(args: argparse.Namespace) -> int:
    if not (args.mesh and args.topology):
        print("aot: --mesh and --topology go together (e.g. --mesh fsdp=64,tp=4 "
              "--topology v5e:16x16)", file=sys.stderr)
        return 2
    spec = load(args.model)
    if args.layers:
        spec = spec.at_depth(args.layers)
    report = pod.compile_pod_step(spec, args.topology, pod.parse_mesh(args.mesh), args.batch,
                                  async_collectives=not args.sync_collectives,
                                  remat=args.remat)
    if args.hlo:
        with open(args.hlo, "w") as f:
            f.write(report.hlo)
    if args.json:
        # the compile's own peak memory and CPU time on this machine, to plan a larger one
        # (CPU, not wall clock: on a loaded machine the wall clock says little)
        use = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps(dict(report.as_json(), max_rss_bytes=use.ru_maxrss * 1024,
                              cpu_seconds=round(use.ru_utime + use.ru_stime, 1)), indent=1))
    else:
        print(report.format())
    return 0 if report.fits else 1


def _kernels(chips: list[str], args: argparse.Namespace) -> int:
    def progress(r):
        print(f"  {r.kernel:24s} {r.chip:4s} {r.seconds:6.1f} s  {r.cell()}", file=sys.stderr,
              flush=True)
    results = check_kernels(chips, thorough=args.thorough, progress=progress)
    if args.json:
        print(json.dumps([dict(kernel=r.kernel, chip=r.chip, ok=r.ok, reason=r.reason,
                               vmem_bytes=r.vmem_bytes, seconds=round(r.seconds, 2))
                          for r in results], indent=1))
    else:
        print(table(results))
        print(f"\ncompile time of the set: {sum(r.seconds for r in results):.0f} s")
    return 0 if all(r.ok for r in results) else 1


def _model(target: str, chips: list[str], args: argparse.Namespace) -> int:
    reports = compile_model(load(target), chips)
    if args.json:
        print(json.dumps([_report_json(r) for r in reports], indent=1))
    else:
        print("\n\n".join(r.format() for r in reports))
    return 0 if all(r.ok for r in reports) else 1


def _report_json(r) -> dict:
    return dict(model=r.model, chip=r.chip, params=r.params, tokens=r.tokens,
                model_flops=r.model_flops, step_seconds=r.step_seconds,
                peak_hbm_bytes=r.peak_hbm_bytes, mfu=r.mfu, failures=dict(r.failures),
                programs=[dict(kind=k, argument_bytes=s.argument_bytes,
                               output_bytes=s.output_bytes, temp_bytes=s.temp_bytes,
                               alias_bytes=s.alias_bytes, optimal_seconds=s.optimal_seconds,
                               compile_seconds=s.compile_seconds,
                               kernels=sorted({k.name for k in s.kernels}))
                          for k, s in r.programs])
