"""The kernels ``python -m tpu_kernels tune`` can search, and how: per kernel, the
parameters it tunes, the shape classes tuned by default, the candidate configurations,
the program that runs one configuration at a class's representative shape, the kernel's
own VMEM arithmetic for a configuration, and what its heuristic picks without a table.

Default classes are the shapes the cost table (``python -m tpu_kernels costs``) judges,
forward and backward (Llama-3-8B sizes, their small and ragged variants, head_dim 64).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from tpu_kernels.pallas import cross_entropy as ce
from tpu_kernels.pallas import flash_attention as fa
from tpu_kernels.pallas import matmul as mm
from tpu_kernels.pallas import tpu_info, tuned
from tpu_kernels.pallas.launch import max_vmem_bytes
from tpu_kernels.pallas.tpu_info import round_up

S = jax.ShapeDtypeStruct
Dims = dict[str, int]
Config = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Tunable:
    kernel: str                                                  # the table's name
    params: tuple[str, ...]                                      # ("bm", "bn", "bk")
    classes: tuple[str, ...]                                     # ``tuned.shape_class`` strings
    candidates: Callable[[Any, Dims, tpu_info.Chip], list[Config]]
    program: Callable[[Any, Dims, Config], tuple[Callable[..., Any], list]]
    vmem: Callable[[Any, Dims, Config], int]                     # the kernel's own estimate
    heuristic: Callable[[Any, Dims, tpu_info.Chip], Config]      # choose_blocks without a table
    exposed: Callable[[Any, Dims, Config], int]                  # bytes of pipeline fill + drain

    def legal(self, dtype: Any, dims: Dims, chip: tpu_info.Chip) -> list[Config]:
        """Candidates whose VMEM estimate ``launch.vmem_limit`` can make room for."""
        cap = max_vmem_bytes(chip)
        return [c for c in self.candidates(dtype, dims, chip) if self.vmem(dtype, dims, c) <= cap]


def _sizes(dim: int, align: int, lo: int, hi: int = 4096) -> list[int]:
    """Powers of two from ``lo`` to ``hi``, each clamped to ``dim`` padded to ``align``."""
    top = round_up(dim, align)
    out, b = [], lo
    while b <= hi:
        out.append(min(b, top))
        b *= 2
    return sorted(set(out))


# -- matmul ---------------------------------------------------------------------------

def _mm_candidates(dtype: Any, d: Dims, chip: tpu_info.Chip) -> list[Config]:
    sub, wide = tpu_info.sublane(dtype), max(chip.mxu, 128)
    return [(bm, bn, bk) for bm in _sizes(d["m"], sub, 128, 2048)
            for bn in _sizes(d["n"], 128, wide) for bk in _sizes(d["k"], 128, wide)]


def _mm_program(dtype: Any, d: Dims, c: Config) -> tuple[Callable[..., Any], list]:
    fn = lambda a, b: mm.matmul(a, b, block=c)  # noqa: E731
    return fn, [S((d["m"], d["k"]), dtype), S((d["k"], d["n"]), dtype)]


def _mm_exposed(dtype: Any, d: Dims, c: Config) -> int:
    """The first A and B blocks load before the first step computes; the last output
    block stores after the last one."""
    bm, bn, bk = c
    return (bm * bk + bk * bn + bm * bn) * jnp.dtype(dtype).itemsize


MATMUL = Tunable(
    "matmul", ("bm", "bn", "bk"),
    tuple(tuned.shape_class(jnp.bfloat16, m=m, n=n, k=k) for m, n, k in (
        (8192, 14336, 4096), (8192, 4096, 14336), (4096, 14336, 8192),   # prod: fwd, dA, dB
        (512, 14336, 4096), (512, 4096, 14336), (4096, 14336, 512),      # small
        (520, 1408, 1100),                                               # ragged
        (4096, 4096, 128), (4096, 128, 4096), (1100, 1100, 128))),       # bmm (attention-like)
    _mm_candidates, _mm_program,
    lambda dtype, d, c: mm.vmem_bytes(c, dtype),
    lambda dtype, d, chip: mm.choose_blocks(d["m"], d["n"], d["k"], dtype, chip),
    _mm_exposed,
)


# -- flash attention (forward + backward, causal, GQA 4:1) -----------------------------

def _fa_candidates(dtype: Any, d: Dims, chip: tpu_info.Chip) -> list[Config]:
    return [(bq, bk) for bq in _sizes(d["sq"], 128, 256, 2048) for bk in _sizes(d["skv"], 128, 256, 2048)]


def _fa_program(dtype: Any, d: Dims, c: Config) -> tuple[Callable[..., Any], list]:
    def loss(q, k, v):
        return fa.flash_attention(q, k, v, causal=True, block=c).astype(jnp.float32).sum()
    fn = jax.value_and_grad(loss, argnums=(0, 1, 2))
    kv = S((1, 2, d["skv"], d["d"]), dtype)
    return fn, [S((1, 8, d["sq"], d["d"]), dtype), kv, kv]


def _fa_exposed(dtype: Any, d: Dims, c: Config) -> int:
    """Per kernel, its first blocks in and its last out: forward q, k, v in and o out; dq
    q, dO, k, v in and dq out; dK/dV q, dO, k, v in and dk, dv out."""
    bq, bk = c
    hd = d["d"]       # a full-dim block: the head dim is not padded
    return (2 * bq + 2 * bk + 3 * bq + 2 * bk + 2 * bq + 4 * bk) * hd * jnp.dtype(dtype).itemsize


FLASH_ATTENTION = Tunable(
    "flash_attention", ("bq", "bk"),
    tuple(tuned.shape_class(jnp.bfloat16, sq=s, skv=s, d=hd) for s, hd in (
        (4096, 128), (8192, 128), (1100, 128), (4096, 64))),
    _fa_candidates, _fa_program,
    lambda dtype, d, c: fa.vmem_bytes(c, d["d"], dtype),
    lambda dtype, d, chip: fa.choose_blocks(d["sq"], d["skv"], d["d"], dtype, chip),
    _fa_exposed,
)

# -- cross entropy (forward + backward; no block argument: the tuner forces the lookup) ---

def _ce_candidates(dtype: Any, d: Dims, chip: tpu_info.Chip) -> list[Config]:
    sub = tpu_info.sublane(dtype)
    return [(bn, bv) for bn in _sizes(d["n"], sub, 64, 512) for bv in _sizes(d["v"], 128, 512, 8192)]


def _ce_program(dtype: Any, d: Dims, c: Config) -> tuple[Callable[..., Any], list]:
    grad = jax.value_and_grad(lambda x, t: ce.cross_entropy(x, t))

    def fn(x, t):
        with tuned.forced("cross_entropy", {"bn": c[0], "bv": c[1]}):
            return grad(x, t)
    return fn, [S((d["n"], d["v"]), dtype), S((d["n"],), jnp.int32)]


CROSS_ENTROPY = Tunable(
    "cross_entropy", ("bn", "bv"),
    tuple(tuned.shape_class(jnp.bfloat16, n=n, v=v) for n, v in ((8192, 128256), (512, 128256), (520, 50257))),
    _ce_candidates, _ce_program,
    lambda dtype, d, c: ce.vmem_bytes(c[0], c[1], dtype),
    lambda dtype, d, chip: ce.block_sizes(d["n"], d["v"], dtype, chip),
    lambda dtype, d, c: 2 * c[0] * c[1] * jnp.dtype(dtype).itemsize,    # a logits block in, its grad out
)

TUNABLES: dict[str, Tunable] = {t.kernel: t for t in (MATMUL, FLASH_ATTENTION, CROSS_ENTROPY)}


def get(kernel: str) -> Tunable:
    if kernel not in TUNABLES:
        raise ValueError(f"tune: no search is defined for kernel {kernel!r}; tunable: {sorted(TUNABLES)}")
    return TUNABLES[kernel]
