"""The ragged paged attention kernel on each TPU generation, without a TPU.

For serving-sized workloads (256 sequences, contexts up to 8192, pages of 16-128 tokens):
the kernel compiled by the real XLA:TPU + Mosaic compiler (libtpu compile-only
topologies), the VMEM the compiler gives it, XLA's cost figures for the call (from the
kernel's static ``pl.CostEstimate``, an upper bound), and the modelled time of the
workload's actual lengths: the work the kernel does (``ragged_paged_attention.cost``)
against the chip's peak FLOP/s and HBM bandwidth (``pallas/tpu_info.py``).

    python -m tpu_kernels.bench.paged_attention [--chips v5e,v6e,...] [--workloads NAME,...]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels import aot
from tpu_kernels.pallas import ragged_paged_attention as rpa
from tpu_kernels.pallas import tpu_info



@dataclasses.dataclass(frozen=True)
class Workload:
    """One engine step: per-sequence new tokens and context lengths, cache geometry."""
    name: str
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    page_size: int
    max_context: int
    num_q_heads: int = 32          # Llama-3-8B attention: 32 query heads, 8 kv heads, d 128
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"

    @property
    def pages_per_seq(self) -> int:
        return self.max_context // self.page_size

    def shapes(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs;
        the cache holds every sequence's full page list."""
        s, p = len(self.q_lens), self.pages_per_seq
        pages = (s * p, self.num_kv_heads, self.page_size, self.head_dim)
        return [((sum(self.q_lens), self.num_q_heads, self.head_dim), self.dtype),
                (pages, self.dtype), (pages, self.dtype), ((s,), "int32"), ((s, p), "int32"),
                ((s + 1,), "int32"), ((1,), "int32")]

    def cost(self) -> dict[str, float]:
        t, s = sum(self.q_lens), len(self.q_lens)
        blocks = rpa.choose_blocks(t, s, self.num_kv_heads, self.num_q_heads // self.num_kv_heads,
                                   self.page_size, self.pages_per_seq, self.head_dim, self.dtype)
        return rpa.cost(self.q_lens, self.kv_lens, self.num_q_heads, self.num_kv_heads,
                        self.head_dim, self.dtype, blocks, self.page_size)


def _mixed_contexts(n: int, hi: int, seed: int = 0) -> tuple[int, ...]:
    return tuple(int(x) for x in np.random.default_rng(seed).integers(1, hi + 1, n))


def _mixed_step(n: int = 256, chunks: int = 8, chunk: int = 128) -> Workload:
    """``chunks`` sequences prefilling ``chunk`` tokens, the rest decoding."""
    ctx = _mixed_contexts(n, 8192 - chunk, seed=1)
    q = tuple(chunk if i < chunks else 1 for i in range(n))
    kv = tuple(c + (chunk if i < chunks else 0) for i, c in enumerate(ctx))
    return Workload("mixed_prefill_ps128_f32", q, kv, 128, 8192, 16, 4, 128, "float32")


WORKLOADS = {w.name: w for w in [
    Workload("decode_ctx8192_ps16_bf16", (1,) * 256, (8192,) * 256, 16, 8192),
    Workload("decode_mixed_ps64_bf16", (1,) * 256, _mixed_contexts(256, 8192), 64, 8192),
    _mixed_step(),
    Workload("decode_ctx4096_ps32_f32_gqa7", (1,) * 256, (4096,) * 256, 32, 4096, 28, 4,
             128, "float32"),
]}


def scoped_vmem(hlo_text: str, kernel: str = "ragged_paged_attention") -> int | None:
    """VMEM the compiler scoped for the kernel's custom call (bytes), from its HLO."""
    for line in hlo_text.splitlines():
        if f"%{kernel}" in line and "tpu_custom_call" in line:
            m = re.search(r'"used_scoped_memory_configs":\[\{[^]]*"size":"(\d+)"', line)
            return int(m.group(1)) if m else None
    return None


def compile_kernel(chip: str, w: Workload) -> dict:
    """Compile the kernel for ``chip`` at the workload's shapes (nothing is allocated)."""
    specs = [jax.ShapeDtypeStruct(shape, jnp.dtype(dt)) for shape, dt in w.shapes()]
    t0 = time.perf_counter()
    compiled = aot.compile(rpa.ragged_paged_attention, *specs, chip=chip).executable
    seconds = time.perf_counter() - t0
    ca, mem = compiled.cost_analysis(), compiled.memory_analysis()
    return {"chip": chip, "workload": w.name, "compile_s": seconds,
            "vmem_bytes": scoped_vmem(compiled.as_text()),
            "xla_flops": ca.get("flops"), "xla_bytes": ca.get("bytes accessed"),
            "xla_seconds": ca.get("optimal_seconds"),
            "hbm_argument_bytes": mem.argument_size_in_bytes,
            "hbm_temp_bytes": mem.temp_size_in_bytes}


# float32 matmuls at HIGHEST precision take six bf16 MXU passes
_MXU_PASSES = {"bfloat16": 1, "float32": 6}


def modelled_seconds(chip: str, w: Workload) -> dict[str, float]:
    """Roofline time of the workload's actual work on ``chip``: max(compute, memory)."""
    c, peak = w.cost(), tpu_info.CHIPS[chip]
    compute = c["flops"] * _MXU_PASSES[w.dtype] / peak.bf16_flops
    memory = c["bytes"] / peak.hbm_bytes_per_s
    return {**c, "compute_s": compute, "memory_s": memory, "seconds": max(compute, memory)}


def report(chips: list[str], workloads: list[str]) -> list[dict]:
    rows = []
    for name in workloads:
        w = WORKLOADS[name]
        for chip in chips:
            row = {"chip": chip, "workload": name}
            try:
                row |= compile_kernel(chip, w)
                row["compiles"] = True
            except Exception as exc:  # noqa: BLE001  (a compile failure is a result here)
                row |= {"compiles": False, "error": str(exc).splitlines()[0][:300]}
            row["modelled"] = modelled_seconds(chip, w)
            rows.append(row)
    return rows


def _fmt(row: dict) -> str:
    m = row["modelled"]
    head = f"{row['workload']:<30} {row['chip']:<4}"
    if not row["compiles"]:
        return f"{head} FAIL {row['error']}"
    vmem = row["vmem_bytes"]
    return (f"{head} ok  compile {row['compile_s']:5.1f}s  VMEM "
            f"{'?' if vmem is None else f'{vmem / 2**10:.0f} KiB'}  modelled "
            f"{m['seconds'] * 1e3:7.3f} ms ({'memory' if m['memory_s'] >= m['compute_s'] else 'compute'}"
            f"-bound, {m['bytes'] / 2**30:.2f} GiB, {m['flops'] / 1e9:.1f} GFLOP)  XLA bound {row['xla_seconds'] * 1e3:.3f} ms")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chips", default=",".join(tpu_info.CHECKED_GENERATIONS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)     # as the runtime runs: the kernel is 32-bit
    rows = report(args.chips.split(","), args.workloads.split(","))
    for row in rows:
        print(_fmt(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
