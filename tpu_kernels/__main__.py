"""Command line: ``python -m tpu_kernels {demo,coverage,bench}``."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small GPT on CPU and on tpu, side by side")
    demo.add_argument("--steps", type=int, default=10)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        import tpu_kernels  # noqa: F401
        from tpu_kernels import demo as demo_mod
        demo_mod.main(args.steps)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
