"""Command line: ``python -m tpu_kernels {demo,coverage,bench,aot,costs,tune}``."""
from __future__ import annotations

import argparse
import sys

from tpu_kernels import coverage, demo
from tpu_kernels.aot import cli as aot_cli   # libtpu loads only when a chip is asked for
from tpu_kernels.aot import cost_table, tune
from tpu_kernels.bench import runner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    demo_args = sub.add_parser("demo", help="train a small GPT on CPU and on tpu, side by side")
    demo_args.add_argument("--steps", type=int, default=10)
    bench = sub.add_parser("bench", help="per-kernel microbenchmarks (every impl vs torch on the CPU)",
                           description=runner.__doc__.split("\n\n")[0])
    runner.add_arguments(bench)
    cov = sub.add_parser("coverage", help="op coverage report: targets, impls, parity, speed",
                         description=coverage.cli.DESCRIPTION)
    coverage.add_arguments(cov)

    aot = sub.add_parser("aot", help="compile kernels or a model's training step for a TPU "
                                     "chip, on this machine (libtpu compile-only)",
                         description=aot_cli.__doc__.split("\n\n")[0])
    aot_cli.add_arguments(aot)

    costs = sub.add_parser("costs", help="each kernel's modelled time against XLA's compiled estimate, "
                                         "per chip and shape class (the registry's choice on TPU)",
                           description=cost_table.__doc__.split("\n\n")[0])
    cost_table.add_arguments(costs)

    tuner = sub.add_parser("tune", help="search a kernel's block sizes per chip and shape class "
                                        "(on a TPU by timing; here by real compile, VMEM and the cost model)",
                           description=tune.__doc__.split("\n\n")[0])
    tune.add_arguments(tuner)

    args = parser.parse_args(argv)
    if args.command == "demo":
        demo.main(args.steps)
        return 0
    if args.command == "bench":
        return runner.main_args(args)
    if args.command == "coverage":
        return coverage.main_args(args)
    if args.command == "costs":
        return cost_table.main_args(args)
    if args.command == "tune":
        return tune.main_args(args)
    if args.command == "aot":
        return aot_cli.main_args(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
