"""Graph mode vs eager: the small GPT's forward and training step in every mode, one run.

    python -m tpu_kernels.bench.graph_modes [--sizes small,medium] [--iters 20]

Modes: tpu eager (op by op), tpu deferred (``tpu_kernels.deferred()``), tpu compiled
(``torch.compile(backend="tpu")``), tpu graph (the step captured once with
``torch.tpu.graph`` and replayed: one executable, no Python per op; its AdamW is
``capturable=True``, two eager steps warm it up, and "first" is the first replay, which
compiles), torch CPU eager, torch CPU inductor
(``torch.compile``), and the same model written directly in JAX and jitted
(``bench/jax_gpt.py``: the XLA limit for this graph). A training step is forward,
backward and AdamW; the compiled modes compile the loss (forward and backward graphs)
and the optimizer step. Each row: median seconds per call after warm-up, the first call
(compile included), and the ratio to tpu eager. All numbers come from one run.
``--clock cpu`` times the process's CPU time (all threads, XLA's included) instead of
wall time: on a loaded machine it is the steadier measure of the work a call costs.
``--matmul-precision`` sets ``torch.set_float32_matmul_precision`` for the run (torch's
default "highest" is full float32: several bf16 passes per matmul on a TPU; "medium" is
one, JAX's own default); the JAX reference runs at the same precision.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import time
from typing import Any, Callable

import torch

from tpu_kernels.deferred_mode import deferred
from tpu_kernels.bench import jax_gpt
from tpu_kernels.bench.timing import measure
from tpu_kernels.models import GPT, GPTConfig

SIZES = {
    "small": (GPTConfig(), 4),
    "medium": (GPTConfig(vocab=512, seq=128, dim=256, heads=8, layers=4), 8),
}
MODES = ["tpu eager", "tpu deferred", "tpu compiled", "tpu graph", "cpu eager", "cpu inductor", "jax jit"]


def replaying(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` captured into a tpu graph: each call replays it and returns its outputs."""
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        out = fn()
    return lambda: (g.replay(), out)[1]


def _forward(mode: str, model: GPT, tokens: torch.Tensor) -> Callable[[], Any]:
    if mode == "jax jit":
        fwd, _ = jax_gpt.jitted(model.cfg.layers, model.cfg.heads)
        p, toks = jax_gpt.params_from(model), jax_gpt.tokens_from(tokens)
        return lambda: fwd(p, toks)
    dev = "cpu" if mode.startswith("cpu") else "tpu"
    m = copy.deepcopy(model).to(dev).eval()
    toks = tokens.to(dev)
    if mode == "tpu compiled":
        m = torch.compile(m, backend="tpu")
    elif mode == "cpu inductor":
        m = torch.compile(m)

    def call():
        with torch.no_grad(), (deferred() if mode == "tpu deferred" else contextlib.nullcontext()):
            return m(toks)
    return replaying(call) if mode == "tpu graph" else call


def _train_step(mode: str, model: GPT, tokens: torch.Tensor) -> Callable[[], Any]:
    if mode == "jax jit":
        _, step = jax_gpt.jitted(model.cfg.layers, model.cfg.heads)
        state = {"p": jax_gpt.params_from(model)}
        state["opt"] = jax_gpt.init_state(state["p"])
        toks = jax_gpt.tokens_from(tokens)

        def jstep():
            loss, state["p"], state["opt"] = step(state["p"], state["opt"], toks)
            return loss
        return jstep
    dev = "cpu" if mode.startswith("cpu") else "tpu"
    m = copy.deepcopy(model).to(dev).train()
    toks = tokens.to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, capturable=mode == "tpu graph")
    loss_fn, opt_step = m.loss, opt.step
    if mode in ("tpu compiled", "cpu inductor"):
        backend = "tpu" if dev == "tpu" else "inductor"
        loss_fn = torch.compile(m.loss, backend=backend)
        opt_step = torch.compile(opt.step, backend=backend)

    def step():
        with deferred() if mode == "tpu deferred" else contextlib.nullcontext():
            opt.zero_grad()
            loss = loss_fn(toks)
            loss.backward()
            opt_step()
        return loss
    if mode == "tpu graph":
        for _ in range(2):      # the optimizer's state exists before the capture
            step()
        return replaying(step)
    return step


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def run(sizes: list[str], iters: int = 20, modes: list[str] | None = None, out=print,
        clock: str = "wall") -> list[dict]:
    rows = []
    for size in sizes:
        cfg, batch = SIZES[size]
        torch.manual_seed(0)
        model = GPT(cfg)
        tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1))
        out(f"\n{size} ({clock} clock): dim {cfg.dim}, {cfg.layers} layers, seq {cfg.seq}, batch {batch}, "
            f"{sum(p.numel() for p in model.parameters()):,} parameters")
        out(f"{'mode':<14} {'fwd ms':>9} {'fwd first s':>12} {'step ms':>9} {'step first s':>13} "
            f"{'fwd vs eager':>13} {'step vs eager':>14}")
        base = {}
        for mode in modes or MODES:
            torch._dynamo.reset()
            fwd = measure(_forward(mode, model, tokens[:, :-1]), iters=iters, clock=CLOCKS[clock])
            step = measure(_train_step(mode, model, tokens), iters=iters, clock=CLOCKS[clock])
            if mode == "tpu eager":
                base = {"fwd": fwd["median"], "step": step["median"]}
            row = {"size": size, "mode": mode, "fwd_s": fwd["median"], "fwd_first_s": fwd["first"],
                   "step_s": step["median"], "step_first_s": step["first"],
                   "fwd_speedup": base["fwd"] / fwd["median"] if base else None,
                   "step_speedup": base["step"] / step["median"] if base else None}
            rows.append(row)
            out(f"{mode:<14} {fwd['median'] * 1e3:>9.2f} {fwd['first']:>12.2f} "
                f"{step['median'] * 1e3:>9.2f} {step['first']:>13.2f} "
                f"{_ratio(row['fwd_speedup']):>13} {_ratio(row['step_speedup']):>14}")
    return rows


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="small,medium")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    p.add_argument("--matmul-precision", choices=("highest", "high", "medium"),   # torch's values
                   default=torch.get_float32_matmul_precision())
    a = p.parse_args()
    torch.set_float32_matmul_precision(a.matmul_precision)
    print(f"float32 matmul precision: {a.matmul_precision} (torch and the JAX reference)")
    run(a.sizes.split(","), a.iters, a.modes.split(","), clock=a.clock)


if __name__ == "__main__":
    main()
