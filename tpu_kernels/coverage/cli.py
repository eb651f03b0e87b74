"""``python -m tpu_kernels coverage``: arguments, and where the report goes."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from tpu_kernels.coverage.model import format_model_report, model_ops
from tpu_kernels.coverage.render import chart_png, filter_rows, format_html, format_markdown, format_text
from tpu_kernels.coverage.report import build, check_report
from tpu_kernels.coverage.results import RESULTS_DIR

DESCRIPTION = "Op coverage report: which target ops run on tpu, by what, how well, how fast."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", help="1, 2, 3 or custom (comma-separated)")
    p.add_argument("--kind", help="ops having an impl of this kind: pallas, helion, xla, user, runtime, decomp, none")
    p.add_argument("--missing", action="store_true", help="only target overloads with no tpu impl")
    p.add_argument("--op", help="substring of the op name, e.g. softmax")
    p.add_argument("--format", choices=("text", "json", "markdown", "html"), default="text")
    p.add_argument("--output", "-o", metavar="PATH", help="write the report here instead of stdout")
    p.add_argument("--chart", metavar="PATH", help="write the PNG chart (stacked bars per tier by kind)")
    p.add_argument("--export-check", action="store_true",
                   help="compile every Pallas/Helion impl for v5e, v6e and v7x now with the real TPU "
                        "compiler (libtpu; with --op, only those ops); records .tpu_kernels/export.json")
    p.add_argument("--won-by", action="store_true",
                   help="ask the cost model which impl wins on each chip for every op with a kernel (minutes)")
    p.add_argument("--results", default=RESULTS_DIR, metavar="DIR", help="results directory (.tpu_kernels)")
    p.add_argument("--model", metavar="MODULE:FACTORY",
                   help="trace a model: FACTORY() returns (model, example_inputs), the inputs a tuple "
                        "or a dict of keyword arguments; lists the ops it needs and those no tpu impl runs")


def main(argv: list[str] | None = None, out=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tpu_kernels coverage", description=DESCRIPTION)
    add_arguments(p)
    return main_args(p.parse_args(argv), out=out)


def _load_model(spec: str):
    mod_name, _, fn_name = spec.partition(":")
    if not fn_name:
        raise SystemExit("coverage --model: expected MODULE:FACTORY")
    sys.path.insert(0, os.getcwd())
    made = getattr(importlib.import_module(mod_name), fn_name)()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise SystemExit("coverage --model: FACTORY() must return (model, example_inputs)")
    model, inputs = made
    if isinstance(inputs, dict):   # keyword inputs (a transformers model's batch)
        return model, (), inputs
    return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,), {}


def main_args(a: argparse.Namespace, out=None) -> int:
    write = out or (lambda s: print(s))
    if a.model:
        model, inputs, kw_inputs = _load_model(a.model)
        print(f"coverage: tracing {a.model} on CPU (forward + backward)...", file=sys.stderr)
        rep = model_ops(model, *inputs, **kw_inputs)
        text = json.dumps(rep, indent=1, default=str) if a.format == "json" else format_model_report(rep)
        _emit(text, a.output, write)
        return 0
    rep = build(results_dir=a.results, do_export_check=a.export_check, export_ops=a.op,
                won_by=a.won_by)
    rows = filter_rows(rep["rows"], a.tier, a.kind, a.missing, a.op)
    if a.format == "json":
        shown = dict(rep, rows=rows)
        errs = check_report(shown)
        if errs:  # the report's own format drifted: say so loudly
            raise AssertionError("coverage JSON is malformed:\n" + "\n".join(errs[:20]))
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
