"""The matmul and grouped-matmul kernels per chip, from the cost model and the real
compiler (libtpu compile-only, ``tpu_kernels.aot``), no TPU needed: modelled time
(``registry.costs.kernel_model``), the share of the MXU work that is padding, HBM bytes
of the kernels and of the passes around them, grid steps; then the compiler's scoped
VMEM per kernel, HBM temporaries, and any operand-sized transpose/copy/pad/slice left
in the optimised HLO (the NT/TN backward must leave none).

    python -m tpu_kernels.bench.matmul_blocks            # every case, v5e v6e v7x
    python -m tpu_kernels.bench.matmul_blocks gmm        # cases whose name holds "gmm"
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp

from tpu_kernels import aot
from tpu_kernels.pallas import grouped_matmul as gm
from tpu_kernels.pallas import matmul as mm
from tpu_kernels.registry.costs import kernel_model

S, BF16, I32 = jax.ShapeDtypeStruct, jnp.bfloat16, jnp.int32
CHIPS = ("v5e", "v6e", "v7x")
Case = tuple[Callable[..., Any], list, float]     # program, specs, useful flops


def _mm(m: int, k: int, n: int, grad: bool) -> Case:
    specs = [S((m, k), BF16), S((k, n), BF16)]
    if grad:   # the jaxpr keeps the forward kernel (XLA drops it): count it as useful
        return (jax.grad(lambda a, b: mm.matmul(a, b).astype(jnp.float32).sum(), (0, 1)),
                specs, 3 * 2 * m * n * k)
    return mm.matmul, specs, 2 * m * n * k


def _gmm(m: int, k: int, n: int, g: int, grad: bool, local: int = 0) -> Case:
    specs = [S((m, k), BF16), S((local or g, k, n), BF16), S((g,), I32)]
    if local:  # a shard: experts [local, 2 * local) of g
        return (lambda a, b, s: gm.gmm(a, b, s, group_offset=local), specs,
                2 * m * n * k * local / g)
    if grad:
        return (jax.grad(lambda a, b, s: gm.ragged_dot(a, b, s).astype(jnp.float32).sum(), (0, 1)),
                specs, 3 * 2 * m * n * k)
    return gm.gmm, specs, 2 * m * n * k


CASES: dict[str, Case] = {
    "mm 520x4096x4096": _mm(520, 4096, 4096, False),
    "mm 4096x1100x4096": _mm(4096, 1100, 4096, False),
    "mm 4096x4096x4096": _mm(4096, 4096, 4096, False),
    "mm 520x1100x4096 fwd+bwd": _mm(520, 1100, 4096, True),
    "mm 4096x4096x4096 fwd+bwd": _mm(4096, 4096, 4096, True),
    "gmm 4096x2048x1408 g8": _gmm(4096, 2048, 1408, 8, False),
    "gmm 4096x2048x1408 g8 fwd+bwd": _gmm(4096, 2048, 1408, 8, True),
    "gmm 4096x2048x1408 8 of 64 experts": _gmm(4096, 2048, 1408, 64, False, local=8),
}
_LINE = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>\S+)\s*=\s*(?P<ty>\w+)\[(?P<dims>[\d,]*)\]\S*\s+"
                   r"(?P<op>[\w-]+)\((?P<rest>.*)$", re.M)


def operand_moves(hlo: str, min_elements: int = 65536) -> list[str]:
    """Operand-sized transposes, copies, pads and slices (as ops or fusions) in ``hlo``."""
    found = []
    for m in _LINE.finditer(hlo):
        size = 1
        for d in filter(None, m["dims"].split(",")):
            size *= int(d)
        moves = m["op"] in ("transpose", "copy", "pad", "slice") or (
            m["op"] == "fusion" and re.search(r"transpose|copy|pad|slice",
                                              m["name"] + m["rest"].split("calls=")[-1][:80]))
        if size >= min_elements and moves:
            found.append(f"{m['name']}:{m['ty']}[{m['dims']}]")
    return found


def row(name: str, case: Case, chip: str) -> str:
    fn, specs, useful = case
    got = kernel_model.model(lambda *a: fn(*a), specs, chip)   # a fresh function per chip
    try:
        compiled = aot.compile(fn, *specs, chip=chip)
        s = compiled.summary
        vmem = ", ".join(f"{(k.vmem_bytes or 0) / 2**20:.1f}" for k in s.kernels)
        moves = operand_moves(compiled.as_text())
        real = f"VMEM [{vmem}] MiB, temp {s.temp_bytes / 2**20:.1f} MiB, moves {moves or 'none'}"
    except Exception as exc:   # report the compiler's reason, keep going
        real = "does not compile: " + aot.explain(exc)
    pad = 1 - useful / got.flops if got.flops else 0.0
    return (f"{name:36s} {chip}: {got.seconds * 1e6:8.1f} us, padding {pad:5.1%}, kernel "
            f"{got.kernel_bytes / 2**20:7.1f} MiB, around {got.wrapper_bytes / 2**20:6.1f} MiB, "
            f"{got.steps} steps | {real}")


def main(argv: list[str]) -> None:
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    for name, case in CASES.items():
        if argv and not any(a in name for a in argv):
            continue
        for chip in CHIPS:
            sys.stdout.write(row(name, case, chip) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
