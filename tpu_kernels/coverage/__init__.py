"""``python -m tpu_kernels coverage``: which target ops run on tpu, by what, how well, how fast.

Built from the live registry, not a hand-kept list: every overload of the target list
(``aten_targets.tsv`` here, tiers 1-3) plus every declared custom op and every higher-order
op with impls (``flex_attention`` and its backward, tier "hop"), with its impls by
kind, the kind that runs (``registry.route``), the impl picked for a typical input (built
from the op's schema and validated by torch's meta kernel; "n/a" when none can be built),
the parity status of the last parity run, whether its kernels compile for v5e / v6e /
v7x (the real TPU compiler, ``tpu_kernels.aot``), and the
kernel-vs-XLA speed ratio of the last benchmark run.

Results files live in ``.tpu_kernels/`` in the working directory: ``parity.json`` (written
by tests/parity), ``bench.json`` (``python -m tpu_kernels bench``) and ``export.json``
(``coverage --export-check``). Their dates are shown; a file older than the newest commit
touching ``registry/`` is reported stale, a missing one as missing.

Kinds (``registry/kinds.py``): ``user``, ``pallas``, ``helion``, ``xla`` (registered impls),
``runtime`` (handled by the tpu runtime itself: copies, ``.item()``, views), ``decomp`` (no
impl: torch's decomposition runs, or the in-place op runs its functional op's impl),
``none`` (missing).

Modules: ``targets`` (the list, ``classify``), ``inputs`` (typical inputs, ``pick``),
``results`` (results files, parity, speed), ``export`` (the TPU compile check),
``report`` (``build``), ``render`` (text, markdown, HTML, chart), ``model`` (the ops a
model needs), ``cli``.
"""
from __future__ import annotations

from tpu_kernels.coverage.cli import add_arguments, main, main_args
from tpu_kernels.coverage.export import export_check, export_text
from tpu_kernels.coverage.inputs import pick, typical_input
from tpu_kernels.coverage.model import format_model_report, model_ops
from tpu_kernels.coverage.render import (chart_png, filter_rows, format_html, format_markdown, format_text,
                                         totals_line)
from tpu_kernels.coverage.report import FORMAT, build, check_report, totals
from tpu_kernels.coverage.results import RESULTS_DIR, bench_speed, parity_status, registry_changed
from tpu_kernels.coverage.targets import CPU_SPECIFIC, IMPL_KINDS, ORDER, TARGETS, TIERS, classify, load_targets

__all__ = ["add_arguments", "main", "main_args", "export_check", "export_text", "pick", "typical_input",
           "format_model_report", "model_ops", "chart_png", "filter_rows", "format_html", "format_markdown",
           "format_text", "totals_line", "FORMAT", "build", "check_report", "totals", "RESULTS_DIR",
           "bench_speed", "parity_status", "registry_changed", "CPU_SPECIFIC", "IMPL_KINDS", "ORDER", "TARGETS",
           "TIERS", "classify", "load_targets"]
