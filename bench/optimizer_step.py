"""An eager optimizer step on tpu parameters, with its fused step run as a program or as a
plain op (``fused_step_programs.py``), A/B in one process.

    python -m tpu_kernels.bench.optimizer_step [--sizes small,medium] [--optimizers AdamW,SGD] [--rounds 6]

For the small GPT of ``graph_modes.py`` and each optimizer (AdamW; SGD with momentum 0.9:
both fused by default on tpu, ``optim_defaults.py``), two cases, ms per step, waited for:

- ``opt.step()``: the eager step alone over fixed gradients (20 steps a round);
- ``loop``: the README's training loop, a compiled loss (``torch.compile(m.loss,
  backend="tpu")``) with ``loss.backward()`` and the eager step (10 steps a round).

The two variants (``programs``: the default, ``plain``: ``TPU_KERNELS_FUSED_STEP_PROGRAMS=0``)
run interleaved round by round on models of the same start; the medians and their ratio
are printed, and whether the two variants' parameters after three steps agree bit for bit.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Callable

import torch

from tpu_kernels import fused_step_programs
from tpu_kernels.bench import graph_modes
from tpu_kernels.bench.timing import sync

OPTIMIZERS: dict[str, Callable] = {
    "AdamW": lambda params: torch.optim.AdamW(params, lr=3e-3),
    "SGD": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
}
VARIANTS = {"programs": True, "plain": False}


def _cases(model: graph_modes.GPT, tokens: torch.Tensor, make_opt: Callable) -> dict[str, Callable]:
    """The two timed cases of one variant (each returns a tensor to wait for)."""
    m = copy.deepcopy(model).to("tpu").train()
    toks = tokens.to("tpu")
    opt = make_opt(m.parameters())
    loss_fn = torch.compile(m.loss, backend="tpu")

    def loop() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn(toks)
        loss.backward()
        opt.step()
        return loss

    p0 = next(m.parameters())

    def step() -> torch.Tensor:
        opt.step()
        return p0
    return {"loop": loop, "opt.step()": step}


def _per_call_ms(fn: Callable, calls: int) -> float:
    sync(fn())
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn()
    sync(out)
    return (time.perf_counter() - t0) / calls * 1e3


def _same_bits(model: graph_modes.GPT, tokens: torch.Tensor, make_opt: Callable) -> bool:
    """Whether three steps of each variant from the same start give equal parameters."""
    toks, results = tokens.to("tpu"), []
    for on in VARIANTS.values():
        fused_step_programs.ON = on
        m = copy.deepcopy(model).to("tpu").train()
        opt = make_opt(m.parameters())
        for _ in range(3):
            opt.zero_grad()
            m.loss(toks).backward()
            opt.step()
        results.append([p.detach().cpu() for p in m.parameters()])
    return all(torch.equal(a, b) for a, b in zip(*results))


def run(sizes: list[str], optimizers: list[str], rounds: int = 6, out=print) -> list[dict]:
    """Print and return one row per (size, optimizer, case)."""
    saved, rows = fused_step_programs.ON, []
    try:
        for size in sizes:
            cfg, batch = graph_modes.SIZES[size]
            torch.manual_seed(0)
            model = graph_modes.GPT(cfg)
            tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1))
            for name in optimizers:
                variants = {}
                for v, on in VARIANTS.items():
                    fused_step_programs.ON = on
                    variants[v] = _cases(model, tokens, OPTIMIZERS[name])
                    for _ in range(3):      # compiled, planned, warm
                        variants[v]["loop"]()
                times = {(v, c): [] for v in variants for c in variants[v]}
                for _ in range(rounds):
                    for v, cases in variants.items():
                        fused_step_programs.ON = VARIANTS[v]
                        for c, fn in cases.items():
                            times[(v, c)].append(_per_call_ms(fn, 10 if c == "loop" else 20))
                same = _same_bits(model, tokens, OPTIMIZERS[name])
                for c in ("opt.step()", "loop"):
                    new, old = (statistics.median(times[(v, c)]) for v in VARIANTS)
                    rows.append({"size": size, "optimizer": name, "case": c, "programs_ms": new,
                                 "plain_ms": old, "ratio": new / old, "bit_equal": same})
                    out(f"{size:7s} {name:6s} {c:11s} programs {new:8.3f} ms  plain {old:8.3f} ms  "
                        f"ratio {new / old:5.2f}  bit-equal {same}")
    finally:
        fused_step_programs.ON = saved
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="small,medium")
    ap.add_argument("--optimizers", default="AdamW,SGD")
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    run(a.sizes.split(","), a.optimizers.split(","), a.rounds)


if __name__ == "__main__":
    main()
