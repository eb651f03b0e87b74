"""What the TPU compiler says about a compiled program, read from its reports.

``memory_analysis()`` gives the HBM the program needs (arguments, outputs, temporaries),
``cost_analysis()`` XLA's FLOPs, bytes and roofline time (``optimal_seconds``; a Pallas
call counts through its ``pl.CostEstimate``), and the optimised HLO (``as_text()``) holds
each Mosaic kernel as a ``tpu_custom_call`` whose backend config records the scoped VMEM
Mosaic allocated for it and the kernel's cost estimate.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from tpu_kernels.pallas import tpu_info

_CALL = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.-]+)\s*=.*custom_call_target=\"tpu_custom_call\""
                   r".*?backend_config=(?P<config>\{.*\})\s*$")
_OP_NAME = re.compile(r'op_name="(?P<op>[^"]*)"')


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One Mosaic kernel in a compiled program."""
    name: str                 # the pallas_call's name (HLO instruction name, suffix dropped)
    op_name: str              # JAX's op_name metadata (where in the program it sits)
    vmem_bytes: int | None    # scoped VMEM Mosaic allocated for it (None: not reported)
    flops: int | None         # from the kernel's pl.CostEstimate (None: it declared none)
    bytes_accessed: int | None
    transcendentals: int | None


@dataclasses.dataclass(frozen=True)
class Summary:
    """The compiler's figures for one program on one chip."""
    chip: str
    kernels: tuple[Kernel, ...]
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int
    flops: float
    bytes_accessed: float
    transcendentals: float
    optimal_seconds: float      # XLA's roofline estimate of one run
    compile_seconds: float
    loops: int = 0              # while loops: XLA's estimate counts each body once
    unknown_calls: tuple[str, ...] = ()   # custom calls XLA may count as -1 s each
    uncosted_seconds: float = 0.0         # added to XLA's estimate (``uncosted_seconds``)
    @property
    def hbm_bytes(self) -> int:
        """Peak HBM the program holds: arguments + outputs (less what aliases) + temps."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def max_kernel_vmem(self) -> int | None:
        sizes = [k.vmem_bytes for k in self.kernels if k.vmem_bytes is not None]
        return max(sizes) if sizes else None

    def format(self) -> str:
        """A few lines for people: HBM, roofline, kernels with their VMEM."""
        mib = 1 / tpu_info.MiB
        lines = [
            f"chip {self.chip}: compiled in {self.compile_seconds:.1f} s",
            f"  HBM: arguments {self.argument_bytes * mib:,.1f} MiB, outputs "
            f"{self.output_bytes * mib:,.1f} MiB (aliased {self.alias_bytes * mib:,.1f}), "
            f"temporaries {self.temp_bytes * mib:,.1f} MiB; peak {self.hbm_bytes * mib:,.1f} MiB",
            f"  XLA estimate: {self.flops:.4g} FLOPs, {self.bytes_accessed:.4g} bytes, "
            f"{self.optimal_seconds * 1e3:.3f} ms"
            + (f" (a lower bound: {self.loops} loop bodies counted once)" if self.loops else "")
            + (f" (uncertain: custom calls {', '.join(self.unknown_calls)})"
               if self.unknown_calls else ""),
            f"  Mosaic kernels: {len(self.kernels)}",
        ]
        for k in self.kernels:
            vmem = "n/a" if k.vmem_bytes is None else f"{k.vmem_bytes * mib:.2f} MiB"
            est = "no cost estimate" if k.flops is None else f"{k.flops:.3g} FLOPs"
            lines.append(f"    {k.name:32s} VMEM {vmem:>11s}  {est}")
        return "\n".join(lines)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _kernel(name: str, config: str, line: str) -> Kernel:
    try:
        cfg = json.loads(config)
    except json.JSONDecodeError:
        cfg = {}
    vmem = [int(m["size"]) for m in cfg.get("used_scoped_memory_configs", [])
            if str(m.get("memory_space")) == "1"]
    est = cfg.get("custom_call_config", {}).get("cost_estimate") or {}
    op = _OP_NAME.search(line)
    # "transpose_jvp_matmul__.3" (a kernel inside autodiff) -> "matmul"
    name = re.sub(r"^(?:(?:transpose|jvp)_+)+", "", re.sub(r"\.\d+$", "", name)).strip("_")
    return Kernel(name=name, op_name=op.group("op") if op else "",
                  vmem_bytes=sum(vmem) if vmem else None, flops=_int(est.get("flops")),
                  bytes_accessed=_int(est.get("bytes_accessed")),
                  transcendentals=_int(est.get("transcendentals")))


def kernels(hlo_text: str) -> tuple[Kernel, ...]:
    """Every Mosaic kernel (``tpu_custom_call``) in an optimised HLO module's text."""
    found = []
    for line in hlo_text.splitlines():
        if "tpu_custom_call" not in line:
            continue
        m = _CALL.match(line)
        if m:
            found.append(_kernel(m.group("name"), m.group("config"), line))
    return tuple(found)


def _cost(compiled: Any) -> dict[str, float]:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):     # older jax: one dict per program
        cost = cost[0] if cost else {}
    return cost or {}


# XLA's cost model has no entry for some custom calls, and each one it counts adds -1 s to
# ``optimal_seconds``: those that split and recombine 64-bit integers (TPUs have no 64-bit
# ALU), concatenate by bitcast, or set up asynchronous calls. (Found by compiling programs
# that hold them: the total comes out short by exactly one second per call.) Every one in
# the entry computation counts. In loop bodies some do and some do not: on v7x the
# SparseCore gather/scatter offloads put PrepareAsyncCall pairs in loop bodies, which never
# count (adding them turned qwen3-moe-small's forward estimate into 16 s); a ConcatBitcast
# in a windowed einsum's loop body counted (llama3-8b at 2 layers on v6e:8x8: -0.961 s
# with the entry's 26 calls added back), three in a routing loop's body did not
# (qwen3-moe-30b at 1 layer on v5e:16x16: adding them made a 0.127 s step 3.127 s). So the
# body's calls are added back only as many as bring the estimate to zero or more: the
# programs compiled here run for well under a second. Custom calls in neither list leave
# the estimate uncertain; the summary names them.
_UNCOSTED = frozenset({"X64SplitLow", "X64SplitHigh", "X64Combine", "ConcatBitcast",
                       "PrepareAsyncCallStart", "PrepareAsyncCallDone"})
_ENTRY_ONLY = frozenset({"PrepareAsyncCallStart", "PrepareAsyncCallDone"})
_COSTED = frozenset({"tpu_custom_call", "AssumeGatherIndicesInBound", "AllocateBuffer",
                     "GatherScatterIndicesBitpacked"})
_TARGET = re.compile(r'custom_call_target="([^"]+)"')


def _entry(hlo_text: str) -> str:
    """The text of an HLO module's ENTRY computation (from its header to its closing brace)."""
    start = hlo_text.find("\nENTRY ")
    if start < 0:
        return hlo_text if hlo_text.startswith("ENTRY ") else ""
    end = hlo_text.find("\n}", start)
    return hlo_text[start:end if end >= 0 else len(hlo_text)]


def uncosted_seconds(hlo_text: str, raw: float) -> float:
    """What XLA's ``optimal_seconds`` (``raw``) lacks for the uncosted custom calls of
    ``hlo_text``: a second for each in the entry computation, and for as many in loop
    bodies as bring the estimate to zero or more."""
    in_entry = _TARGET.findall(_entry(hlo_text))
    entry = sum(t in _UNCOSTED for t in in_entry)
    body = sum(t in _UNCOSTED - _ENTRY_ONLY for t in _TARGET.findall(hlo_text)) - sum(
        t in _UNCOSTED - _ENTRY_ONLY for t in in_entry)
    return entry + min(body, max(0, math.ceil(-(raw + entry))))


def summarize(compiled: Any, chip: str, compile_seconds: float) -> Summary:
    """The ``Summary`` of a ``jax.stages.Compiled`` for ``chip``."""
    mem = compiled.memory_analysis()
    cost = _cost(compiled)
    text = compiled.as_text()
    targets = _TARGET.findall(text)
    raw = float(cost.get("optimal_seconds", 0.0))
    added = uncosted_seconds(text, raw)
    return Summary(
        chip=chip,
        kernels=kernels(text),
        argument_bytes=int(mem.argument_size_in_bytes),
        output_bytes=int(mem.output_size_in_bytes),
        alias_bytes=int(mem.alias_size_in_bytes),
        temp_bytes=int(mem.temp_size_in_bytes),
        generated_code_bytes=int(mem.generated_code_size_in_bytes),
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        transcendentals=float(cost.get("transcendentals", 0.0)),
        optimal_seconds=raw + added,
        compile_seconds=compile_seconds,
        loops=len(re.findall(r"[)\]}] while\(", text)),     # "<result type> while(...)"
        unknown_calls=tuple(sorted(set(targets) - _UNCOSTED - _COSTED)),
        uncosted_seconds=added,
    )
