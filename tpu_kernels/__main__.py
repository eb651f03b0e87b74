"""Command line: ``python -m tpu_kernels {demo,coverage,bench,aot}``."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small GPT on CPU and on tpu, side by side")
    demo.add_argument("--steps", type=int, default=10)

    from tpu_kernels.bench import runner
    bench = sub.add_parser("bench", help="per-kernel microbenchmarks (every impl vs torch on the CPU)",
                           description=runner.__doc__.split("\n\n")[0])
    runner.add_arguments(bench)

    from tpu_kernels import coverage
    cov = sub.add_parser("coverage", help="op coverage report: targets, impls, parity, speed",
                         description=coverage.__doc__.split("\n\n")[0])
    coverage.add_arguments(cov)

    from tpu_kernels.aot import cli as aot_cli   # imports neither libtpu nor torch models
    aot = sub.add_parser("aot", help="compile kernels or a model's training step for a TPU "
                                     "chip, on this machine (libtpu compile-only)",
                         description=aot_cli.__doc__.split("\n\n")[0])
    aot_cli.add_arguments(aot)

    args = parser.parse_args(argv)
    if args.command == "demo":
        import tpu_kernels  # noqa: F401
        from tpu_kernels import demo as demo_mod
        demo_mod.main(args.steps)
        return 0
    if args.command == "bench":
        return runner.main_args(args)
    if args.command == "coverage":
        return coverage.main_args(args)
    if args.command == "aot":
        return aot_cli.main_args(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
