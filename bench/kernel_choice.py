"""Kernel or XLA, measured: each kernel impl and the op's XLA lowering timed on the chip.

    python -m tpu_kernels.bench.kernel_choice [--cases gpt] [--write]

For each case (an op and its arguments: the small and medium GPT's matmuls and attention
of ``graph_modes.py``, their N-d linears and norms, and larger bf16 ones), each impl is run as the program dispatch
would trace for it (``registry.costs.program``), on its own, ``--calls`` times. On a TPU the
time is the device's: the executables' durations in a JAX profiler trace, so launch
overhead and host work are left out. Elsewhere it is wall time per waited call
(a kernel in interpret mode: only the plumbing is checked there). Each row prints the
kernel's time, XLA's, what the cost model (``registry.costs.decide``) would choose and
what the measurement says. ``--write`` merges the rows measured on a TPU into
``registry/costs/measured.json``, which the registry's choice reads before its model
(``registry/costs/measured.py``).
"""
from __future__ import annotations

import argparse
import collections
import glob
import shutil
import tempfile
import time
from typing import Any, Callable

import jax
import numpy as np
import torch

from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry import REGISTRY
from tpu_kernels.registry.costs import decide, measured, xla_table
from tpu_kernels.registry.costs.program import program

aten = torch.ops.aten
_SDPA = aten._scaled_dot_product_flash_attention_for_cpu.default
_SDPA_BWD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _mm(n: int, k: int, m: int, dtype: torch.dtype) -> tuple[Any, tuple, dict]:
    return aten.mm.default, (_meta(n, k, dtype=dtype), _meta(k, m, dtype=dtype)), {}


def _sdpa(b: int, h: int, s: int, d: int, dtype: torch.dtype) -> tuple[Any, tuple, dict]:
    q = _meta(b, h, s, d, dtype=dtype)
    return _SDPA, (q, q, q), {"is_causal": True}


def _sdpa_bwd(b: int, h: int, s: int, d: int, dtype: torch.dtype) -> tuple[Any, tuple, dict]:
    q, stats = _meta(b, h, s, d, dtype=dtype), _meta(b, h, s, dtype=torch.float32)
    return _SDPA_BWD, (q, q, q, q, q, stats, 0.0, True), {}


def _linear(tokens: tuple[int, ...], d_in: int, d_out: int, dtype: torch.dtype) -> tuple[Any, tuple, dict]:
    w, b = _meta(d_out, d_in, dtype=dtype), _meta(d_out, dtype=dtype)
    return torch.ops.tpu_kernels.linear.default, (_meta(*tokens, d_in, dtype=dtype), w, b), {}


def _linear_weight_grad(tokens: tuple[int, ...], d_in: int, d_out: int, dtype: torch.dtype) -> tuple[Any, tuple, dict]:
    return (torch.ops.tpu_kernels.linear_weight_grad.default,
            (_meta(*tokens, d_out, dtype=dtype), _meta(*tokens, d_in, dtype=dtype)), {})


def _layer_norm(rows: int, dim: int, dtype: torch.dtype) -> tuple[Any, tuple, dict]:
    return aten.native_layer_norm.default, (_meta(rows, dim, dtype=dtype), [dim], _meta(dim, dtype=dtype),
                                            _meta(dim, dtype=dtype), 1e-5), {}


def _layer_norm_bwd(rows: int, dim: int, dtype: torch.dtype) -> tuple[Any, tuple, dict]:
    x, w, stat = _meta(rows, dim, dtype=dtype), _meta(dim, dtype=dtype), _meta(rows, 1, dtype=torch.float32)
    return aten.native_layer_norm_backward.default, (x, x, [dim], stat, stat, w, w, [True, True, True]), {}


_F32, _BF16 = torch.float32, torch.bfloat16
CASES: dict[str, list[tuple[Any, tuple, dict]]] = {
    # graph_modes' GPTs: medium (8 x 128 tokens, dim 256, 8 heads) and small (4 x 32, dim 64)
    "gpt": [_mm(1024, 256, 768, _F32), _mm(1024, 256, 256, _F32), _mm(1024, 256, 1024, _F32),
            _mm(1024, 1024, 256, _F32), _mm(256, 1024, 256, _F32), _mm(1024, 256, 512, _F32),
            _mm(128, 64, 192, _F32), _mm(128, 64, 256, _F32), _mm(128, 256, 64, _F32),
            _sdpa(8, 8, 128, 32, _F32), _sdpa_bwd(8, 8, 128, 32, _F32),
            _sdpa(4, 4, 32, 16, _F32), _sdpa_bwd(4, 4, 32, 16, _F32)],
    # the same models' N-d linears (``tpu_kernels::linear``, its weight gradient) and norms
    "gpt_linear": [_linear((8, 128), 256, 768, _F32), _linear((8, 128), 256, 256, _F32),
                   _linear((8, 128), 256, 1024, _F32), _linear((8, 128), 1024, 256, _F32),
                   _linear_weight_grad((8, 128), 256, 768, _F32), _linear_weight_grad((8, 128), 1024, 256, _F32),
                   _linear((4, 32), 64, 192, _F32), _linear_weight_grad((4, 32), 64, 256, _F32),
                   _layer_norm(1024, 256, _F32), _layer_norm_bwd(1024, 256, _F32)],
    "large": [_mm(2048, 2048, 2048, _BF16), _mm(4096, 4096, 1024, _BF16), _mm(2048, 2048, 2048, _F32),
              _sdpa(1, 8, 2048, 128, _BF16), _sdpa_bwd(1, 8, 2048, 128, _BF16),
              _sdpa(8, 8, 512, 64, _BF16), _sdpa_bwd(8, 8, 512, 64, _BF16)],
}


def _inputs(specs: list) -> list[jax.Array]:
    rng = np.random.default_rng(0)
    return [jax.device_put(rng.standard_normal(s.shape).astype(np.float32).astype(s.dtype)) for s in specs]


def device_seconds(fn: Callable[..., Any], arrays: list, calls: int) -> tuple[float, str]:
    """Seconds per call of ``fn(*arrays)``: the TPU's own time from a profiler trace, or,
    without a TPU, wall time per waited call."""
    jax.block_until_ready(fn(*arrays))       # compiled before timing
    if not tpu_info.on_tpu():
        start = time.perf_counter()
        for _ in range(calls):
            jax.block_until_ready(fn(*arrays))
        return (time.perf_counter() - start) / calls, "wall"
    where = tempfile.mkdtemp(prefix="kernel_choice_")
    try:
        jax.profiler.start_trace(where)
        for _ in range(calls):
            out = fn(*arrays)
        jax.block_until_ready(out)
        jax.profiler.stop_trace()
        data = jax.profiler.ProfileData.from_file(glob.glob(f"{where}/**/*.xplane.pb", recursive=True)[0])
    finally:
        shutil.rmtree(where, ignore_errors=True)
    spans = collections.Counter()
    for plane in data.planes:
        if plane.name.startswith("/device:TPU:0"):
            for line in plane.lines:
                if line.name == "XLA Modules":
                    for e in line.events:
                        spans[e.name] += e.duration_ns
    return sum(spans.values()) / calls * 1e-9, "device"


def rows(cases: list[tuple[Any, tuple, dict]], calls: int = 20, out=print,
         keep: Callable[[dict], None] | None = None) -> list[dict]:
    """One row per kernel impl that accepts a case: its time, XLA's, the model's choice
    (``keep``: called with each row as it is measured)."""
    chip = tpu_info.device_chip().name if tpu_info.on_tpu() else "v5e"
    found = []
    for op, args, kwargs in cases:
        impls = REGISTRY.impls(op)
        xla = next((i for i in impls if i.kind == "xla"), None)
        kernels = [i for i in impls if i.kind in ("pallas", "helion") and i.check(*args, **kwargs) is None]
        if xla is None or not kernels:
            continue
        fn, specs = program(op, xla, args, kwargs)
        arrays = _inputs(specs)
        xla_s, clock = device_seconds(jax.jit(fn), arrays, calls)
        ideal = xla_table.ideal_seconds(fn, specs, chip)
        for impl in kernels:
            kfn, _ = program(op, impl, args, kwargs)
            kernel_s, _ = device_seconds(jax.jit(kfn), arrays, calls)
            model = decide.modelled(op, impl, xla, args, kwargs, chip)
            row = {"op": op.name(), "impl": f"{impl.kind}:{impl.name}", "chip": chip, "clock": clock,
                   "shapes": measured.signature(op, args, kwargs), "kernel_s": kernel_s, "xla_s": xla_s,
                   "model_kernel_s": model.kernel_seconds if model else None,
                   "model_xla_s": model.xla_seconds if model else None,
                   "model_says": None if model is None else ("kernel" if model.kernel_wins else "xla"),
                   "measured_says": "kernel" if kernel_s < xla_s else "xla"}
            row["entry"] = measured.entry(row, op, args, kwargs, ideal)
            found.append(row)
            if keep is not None:
                keep(row)
            out(f"{row['op']:<52} {row['shapes'][:60]:<60} {row['impl']:<20} kernel {kernel_s * 1e6:9.1f} us"
                f"  XLA {xla_s * 1e6:9.1f} us ({clock})  model: {row['model_says']}  measured: {row['measured_says']}")
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default="gpt", help=f"comma-separated: {', '.join(CASES)}")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--write", action="store_true", help="merge TPU rows into registry/costs/measured.json")
    a = p.parse_args()
    def keep(row: dict) -> None:     # written as measured: a run cut short keeps its rows
        if a.write and row["clock"] == "device":
            measured.write(dict([row["entry"]]))
    found = rows([c for name in a.cases.split(",") for c in CASES[name]], a.calls, keep=keep)
    if a.write:
        print(f"wrote {sum(r['clock'] == 'device' for r in found)} measured rows to {measured.PATH}")


if __name__ == "__main__":
    main()
