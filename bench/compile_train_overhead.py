"""Per-call cost of compiled training graphs: AOTAutograd's runtime wrappers vs
``compile_train_fast_path``, A/B in one process.

    python -m tpu_kernels.bench.compile_train_overhead [--calls 200] [--rounds 15] [--clock cpu]

Each case is compiled twice with the ``tpu`` backend, once through AOTAutograd's wrappers
(``compile_train_fast_path.ON`` off while it compiles) and once through the fast path,
as two functions of their own (Dynamo keeps one cache per code object). Rounds of
``--calls`` calls alternate between the two; a round ends reading a result (the last
step runs); the figure is the median round's µs per call. Cases: the one-layer MLP's
forward with its parameters requiring grad ("mlp grad fwd", as in ``compile_overhead``),
its forward and ``.sum().backward()``, and the small GPT's (``models.GPT``) forward with
the cross-entropy loss inside the compiled function and ``.backward()`` (whose fast path,
after two calls, is one joint program of forward and backward: ``compile_joint.py``; with
``TPU_KERNELS_COMPILE_JOINT=0`` the two programs).
``--clock cpu`` (the default) times the calling thread's CPU time: the Python and
dispatch work each path does, steady on a loaded machine (the executables' own run on
XLA's threads is left out). A backward of tpu tensors runs on the calling thread
(``device.py`` turns the engine's multithreading off for it), so ``cpu`` includes the
backward's wrappers; ``--clock process`` times the whole process's CPU time
(XLA's threads included, the same work on both paths), ``--clock wall`` wall time.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from tpu_kernels import compile_backend, compile_train_fast_path
from tpu_kernels.models import GPT, GPTConfig

CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time, "process": time.process_time}


def _call_aot(model: Any, *args: Any) -> Any:
    return model(*args)


def _call_fast(model: Any, *args: Any) -> Any:      # the same body: its own code object
    return model(*args)


def _gpt_loss(gpt: GPT) -> Callable:
    def loss(tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(gpt(tokens).flatten(0, 1), targets.flatten())
    return loss


class _LossModule(torch.nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def _cases() -> dict[str, tuple[Any, tuple, bool]]:
    """name -> (module, arguments, whether a call also runs backward)."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to("tpu")
    gpt = GPT(GPTConfig()).to("tpu")
    tokens = torch.randint(0, 256, (4, 33), device="tpu")
    x = torch.randn(8, 64, device="tpu")
    return {
        "mlp grad fwd": (mlp, (x,), False),
        "mlp fwd+bwd": (mlp, (x,), True),
        "small gpt fwd+bwd": (_LossModule(_gpt_loss(gpt)).to("tpu"), (tokens[:, :-1], tokens[:, 1:]), True),
    }


def _compiled(call: Callable, fast: bool, handed: list) -> Callable:
    def backend(gm, example_inputs, **kw):
        before, compile_train_fast_path.ON = compile_train_fast_path.ON, fast
        try:
            handed.append(compile_backend.tpu_backend(gm, example_inputs, **kw))
        finally:
            compile_train_fast_path.ON = before
        return handed[-1]
    return torch.compile(call, backend=backend)


def _step(compiled: Callable, model: Any, args: tuple, backward: bool) -> Callable[[], Any]:
    def step() -> Any:
        out = compiled(model, *args)
        if backward:
            out = out if out.dim() == 0 else out.sum()
            out.backward()
        return out
    return step


def _round(step: Callable[[], Any], calls: int, clock: Callable[[], float]) -> float:
    t0 = clock()
    for _ in range(calls):
        out = step()
    out.detach().cpu()          # the last call's work runs before the clock stops
    return (clock() - t0) / calls * 1e6


def measure(name: str, model: Any, args: tuple, backward: bool, calls: int, rounds: int,
            clock: str = "cpu") -> dict[str, Any]:
    """Median µs per call of each path (interleaved rounds)."""
    torch._dynamo.reset()
    now = CLOCKS[clock]
    handed: dict[str, list] = {"aot": [], "fast": []}
    steps = {"aot": _step(_compiled(_call_aot, False, handed["aot"]), model, args, backward),
             "fast": _step(_compiled(_call_fast, True, handed["fast"]), model, args, backward)}
    for step in steps.values():
        for _ in range(10):
            step()
    times: dict[str, list] = {k: [] for k in steps}
    for _ in range(rounds):
        for k, step in steps.items():
            times[k].append(_round(step, calls, now))
    for p in model.parameters():
        p.grad = None
    row = {"case": name, **{k: statistics.median(v) for k, v in times.items()},
           "fast path": all(type(h).__name__ == "method" and h.__self__.__name__ == "_Compiled"
                            for h in handed["fast"])}
    row["saved"] = row["aot"] - row["fast"]
    row["ratio"] = row["aot"] / row["fast"]
    return row


def run(calls: int = 200, rounds: int = 15, clock: str = "cpu", out=print) -> list[dict]:
    rows = []
    out(f"{'case':<20}{'aot µs':>10}{'fast µs':>10}{'saved µs':>10}{'aot/fast':>10}   ({clock} clock, "
        f"median of {rounds} interleaved rounds of {calls} calls)")
    with torch.enable_grad():
        for name, (model, args, backward) in _cases().items():
            row = measure(name, model, args, backward, calls, rounds, clock)
            rows.append(row)
            out(f"{name:<20}{row['aot']:>10.1f}{row['fast']:>10.1f}{row['saved']:>10.1f}{row['ratio']:>9.2f}x"
                + ("" if row["fast path"] else "   (the fast path did not fit)"))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--clock", choices=list(CLOCKS), default="cpu")
    a = p.parse_args()
    run(a.calls, a.rounds, a.clock)


if __name__ == "__main__":
    main()
