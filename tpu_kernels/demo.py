"""``python -m tpu_kernels demo``: train the small GPT on CPU torch and on tpu, side by side."""
from __future__ import annotations

import copy
import logging
import statistics
import time

import torch

from tpu_kernels import compile_backend, dispatch
from tpu_kernels.models import GPT, GPTConfig, train_step


def main(steps: int = 10, out=print) -> float:
    """Run the demo; returns the largest loss difference between CPU and tpu."""
    torch.manual_seed(0)
    cfg = GPTConfig()
    cpu_model = GPT(cfg)
    init = copy.deepcopy(cpu_model)
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    tokens = torch.randint(0, cfg.vocab, (4, cfg.seq + 1))
    out(f"small GPT: {sum(p.numel() for p in cpu_model.parameters()):,} parameters, "
        f"{cfg.layers} layers, dim {cfg.dim}, vocab {cfg.vocab}; AdamW, {steps} steps")
    out(f"{'step':>4}  {'cpu loss':>10}  {'tpu loss':>10}  {'|diff|':>9}  {'tpu s/step':>10}")
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=3e-3)
    tpu_opt = torch.optim.AdamW(tpu_model.parameters(), lr=3e-3)
    tpu_tokens = tokens.to("tpu")
    worst = 0.0
    cpu_losses = []
    for step in range(steps):
        cl = train_step(cpu_model, cpu_opt, (tokens,)).item()
        cpu_losses.append(cl)
        t0 = time.perf_counter()
        tl = train_step(tpu_model, tpu_opt, (tpu_tokens,)).item()
        dt = time.perf_counter() - t0
        worst = max(worst, abs(cl - tl))
        out(f"{step:>4}  {cl:>10.5f}  {tl:>10.5f}  {abs(cl - tl):>9.2e}  {dt:>10.3f}")
    out(f"max |loss difference| over {steps} steps: {worst:.2e}")
    worst = max(worst, compiled(init, tokens, cpu_losses, out))
    out("")
    out(op_table())
    return worst


def compiled(init: GPT, tokens: torch.Tensor, cpu_losses: list[float], out=print) -> float:
    """The same training under torch.compile(backend="tpu"): loss (forward and backward)
    and optimizer step compiled; returns the largest loss difference from CPU."""
    model = copy.deepcopy(init).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = torch.compile(model.loss, backend="tpu")
    opt_step = torch.compile(opt.step, backend="tpu")
    # torch's optimizer labels its step for the profiler; inside a compiled step Dynamo
    # drops the label and says so once: not a problem of this run, so not shown
    logging.getLogger("torch._dynamo.variables.ctx_manager").addFilter(
        lambda rec: "Profiler record function" not in rec.getMessage())
    start = len(compile_backend.PROGRAMS)
    tpu_tokens, worst, times = tokens.to("tpu"), 0.0, []
    for cl in cpu_losses:
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(tpu_tokens)
        loss.backward()
        opt_step()
        worst = max(worst, abs(loss.item() - cl))
        times.append(time.perf_counter() - t0)
    programs = compile_backend.PROGRAMS[start:]
    out(f"torch.compile(backend='tpu'): {len(programs)} XLA programs (forward, backward, "
        f"optimizer step; {sum(len(p.gm.graph.nodes) for p in programs)} graph nodes); "
        f"first step {times[0]:.1f} s (compiles), then {statistics.median(times[1:]) * 1e3:.1f} "
        f"ms/step; max |loss difference| from CPU: {worst:.2e}")
    return worst


def op_table() -> str:
    """The ATen ops that ran on tpu, with the impl kind each used and its call count."""
    counts = sorted(dispatch.op_counts().items(), key=lambda kv: (-kv[1], kv[0]))
    width = max((len(op) for (op, _), _ in counts), default=10)
    lines = [f"{'ATen op':<{width}}  {'impl':<7}  {'calls':>6}", "-" * (width + 17)]
    lines += [f"{op:<{width}}  {kind:<7}  {n:>6}" for (op, kind), n in counts]
    by_kind: dict[str, int] = {}
    for (_, kind), n in counts:
        by_kind[kind] = by_kind.get(kind, 0) + n
    lines.append(f"{len(counts)} op/impl pairs; calls by impl kind: {by_kind}")
    return "\n".join(lines)
