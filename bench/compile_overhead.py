"""Per-call overhead of ``torch.compile(backend="tpu")``, layer by layer, in one run.

    python -m tpu_kernels.bench.compile_overhead [--calls 2000] [--clock cpu]

For each case (a 64x64 add, a one-layer MLP, the small GPT's forward, and the MLP's forward
with its parameters requiring grad: the training graph behind AOTAutograd's wrappers) it
times, in µs per call (best of several rounds of ``--calls`` calls, the last result synced):

- ``compiled``: the ``torch.compile``'d function as users call it;
- ``frame``: the same function, arguments and guards compiled with a backend that runs
  nothing (it returns the outputs of one real call): Dynamo's frame, its guards and the
  bytecode it runs around the graph (the current-stream lookup it emits for an
  accelerator); ``compiled - frame`` is the backend's call as it runs inside the frame;
- ``guards``: Dynamo's guard check alone (its guard manager on the frame's locals);
- ``aot``: AOTAutograd's compiled function on the arguments Dynamo gives it (what runs
  once the guards pass; for a training graph on ``compile_train_fast_path``, its
  autograd.Function: ``bench/compile_train_overhead.py`` compares the two);
  ``compiled - aot`` is Dynamo's frame and guards;
- ``program``: the ``GraphProgram`` on the graph's flattened inputs (shadows); ``aot -
  program`` is AOTAutograd's wrappers (subclass flattening, output wrapping);
- ``jit``: the program's ``jax.jit`` call alone (statics, key, storages); ``program - jit``
  is argument flattening, the key and results;
- ``exe``: the compiled XLA executable called directly: the program's own run time;
- ``exe-idle``: the executable called 50 µs after its previous call returned (a busy wait
  in between, not counted): what a call costs once XLA's CPU worker threads have gone to
  sleep and must be woken, as inside a compiled frame, where calls are tens of µs apart.
  On a 2-core machine a bare jit add costs ~8 µs within 10 µs of the last call and
  ~22-26 µs from 50 µs on (``jax_cpu_enable_async_dispatch=False`` runs it inline: ~7 µs
  at any spacing); on a TPU host the wake-up is not there;
- ``exe-cold``: the executable called right after the ``frame`` case's call (that call's
  time taken out): the launch as it runs inside a compiled call, after Dynamo's Python. On
  the TPU v5e host a launch is ~120 µs of host work back to back and ~60 µs more after a
  frame (``bench/results/tpu_v5e/2026-12-06-s35.md``; a busy wait does not slow it, Python
  that touches memory does);
- ``graph``: the call captured once with ``torch.tpu.graph`` and replayed (no Dynamo, no
  autograd, no per-op Python: the storages' arrays into one jitted call and back).

``overhead`` = compiled - exe (the issue's target: at most 20 µs); ``over-idle`` = compiled
- exe-idle, the same with the program's call costed as it runs inside the frame (XLA's
wake-up is the CPU backend's, not ours); ``over-cold`` = compiled - exe-cold: Dynamo's
frame and our wrappers, the launch costed as it runs after them; ``graph-exe`` = graph -
exe. Eager is the same code op by op. ``jit`` and ``exe`` are called back to back, which
the CPU backend pipelines: a call between other Python work (as inside ``program`` or
``compiled``) costs it more. Shared machines make absolute figures noisy: compare columns
of one run;
``--clock cpu`` times the calling thread's CPU time instead of wall time (the Python and
dispatch work of each layer, steady on a loaded machine; the executable's own run on
XLA's threads is then left out).
"""
from __future__ import annotations

import argparse
import inspect
import statistics
import time
from typing import Any, Callable

import jax
import torch

from tpu_kernels import compile_backend, graph_inputs, graph_program
from tpu_kernels.bench.graph_modes import replaying
from tpu_kernels.models import GPT, GPTConfig


def _cases() -> dict[str, tuple[Callable, tuple]]:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to("tpu")
    gpt = GPT(GPTConfig()).to("tpu").eval()
    return {
        "add 64x64": (lambda a, b: a + b, (torch.randn(64, 64, device="tpu"), torch.randn(64, 64, device="tpu"))),
        "mlp 1 layer": (mlp, (torch.randn(8, 64, device="tpu"),)),
        "small gpt fwd": (gpt, (torch.randint(0, 256, (4, 32), device="tpu"),)),
        "mlp grad fwd": (mlp, (torch.randn(8, 64, device="tpu"),)),
    }
GRAD = {"mlp grad fwd"}   # run with grad on (parameters require grad): a training graph


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def _per_call(f: Callable[[], Any], calls: int, rounds: int = 5, clock: str = "wall") -> float:
    for _ in range(20):
        out = f()
    now, best = CLOCKS[clock], float("inf")
    for _ in range(rounds):
        t0 = now()
        for _ in range(calls):
            out = f()
        jax.block_until_ready(jax.tree.leaves([graph_inputs.source_of(o)[0].array if isinstance(o, torch.Tensor)
                                                else o for o in (out if isinstance(out, (list, tuple)) else [out])]))
        best = min(best, (now() - t0) / calls)
    return best * 1e6


def _idle_call(f: Callable[[], Any], calls: int, clock: str = "wall", pause_us: float = 50.0) -> float:
    """Median µs of ``f()`` called ``pause_us`` after its previous call returned (the pause
    a busy wait, outside the timed span): XLA's CPU workers asleep, as between the program
    calls of a compiled function."""
    for _ in range(20):
        f()
    now, times = CLOCKS[clock], []
    for _ in range(calls):
        end = time.perf_counter() + pause_us * 1e-6
        while time.perf_counter() < end:
            pass
        t0 = now()
        f()
        times.append(now() - t0)
    return statistics.median(times) * 1e6


class _Replay:
    """A backend that runs nothing: its compiled graph returns ``outputs`` (Dynamo's
    graph returns them as a list)."""

    def __init__(self, outputs: list) -> None:
        self.outputs = outputs

    def __call__(self, gm, example_inputs, **kw):
        return lambda *args: self.outputs


def _guard_check(fn: Callable, args: tuple) -> Callable[[], Any] | None:
    """Dynamo's guard check of ``fn``'s compiled frame on ``args`` (None if not found)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    code = getattr(target, "__code__", None)
    entries = _debug_get_cache_entry_list(code) if code is not None else []
    if not entries:
        return None
    bound = inspect.signature(target).bind(*args)
    bound.apply_defaults()
    f_locals = dict(bound.arguments)
    if isinstance(fn, torch.nn.Module):
        f_locals = {"self": fn, **f_locals}
    manager = entries[0].guard_manager
    return (lambda: manager.check(f_locals)) if manager.check(f_locals) else None


class _Probe:
    """A backend that keeps what AOTAutograd returns and, while ``recording``, the
    arguments Dynamo calls it with (a module's parameters lifted among them)."""

    def __init__(self) -> None:
        self.aot = None
        self.recording = False
        self.args: tuple = ()

    def __call__(self, gm, example_inputs, **kw):
        self.aot = compile_backend.tpu_backend(gm, example_inputs, **kw)
        return self._call

    def _call(self, *args):
        if self.recording:
            self.args = args
        return self.aot(*args)


def _frame(fn: Callable, args: tuple, calls: int, clock: str, exe: Callable[[], Any]) -> dict[str, float]:
    """``frame`` and ``guards``: ``fn`` compiled with a backend that runs nothing (the
    frame, guards and bytecode of the real compile: same code, same arguments); and
    ``exe-cold``: ``exe()`` called right after that frame, the frame's time taken out."""
    torch._dynamo.reset()
    out = fn(*args)
    replay = torch.compile(fn, backend=_Replay([out] if isinstance(out, torch.Tensor) else list(out)))
    replay(*args)
    guards = _guard_check(fn, args)
    row = {"frame": _per_call(lambda: replay(*args), calls, clock=clock)}
    row["guards"] = _per_call(guards, calls, clock=clock) if guards else float("nan")
    row["exe-cold"] = _per_call(lambda: (replay(*args), exe())[1], calls, clock=clock) - row["frame"]
    torch._dynamo.reset()
    return row


def measure(name: str, fn: Callable, args: tuple, calls: int, clock: str = "wall") -> dict[str, float]:
    with torch.set_grad_enabled(name in GRAD):
        torch._dynamo.reset()
        probe = _Probe()
        start = len(compile_backend.PROGRAMS)
        compiled = torch.compile(fn, backend=probe)
        compiled(*args)
        prog = compile_backend.PROGRAMS[start]     # a training graph's forward comes first
        seen = []
        original = type(prog).__call__
        type(prog).__call__ = lambda self, *a: seen.append(a) or original(self, *a)
        probe.recording = True
        try:
            compiled(*args)
        finally:
            type(prog).__call__ = original
            probe.recording = False
        pargs, aot_args = seen[-1], probe.args
        srcs = [graph_inputs.source_of(a) for a, t in zip(pargs, prog.is_tensor) if t]
        statics = (graph_program.settings(), (), tuple(g for _, g in srcs))
        arrays = prog.arguments([st.array for st, _ in srcs])
        key = graph_program._no_key()
        exe = prog._jitted.lower(statics, key, *arrays).compile()
        timed = {
            "compiled": lambda: compiled(*args),
            "aot": lambda: probe.aot(*aot_args),
            "program": lambda: prog(*pargs),
            "jit": lambda: prog._jitted(statics, key, *arrays),
            "exe": lambda: exe(key, *arrays),
            "eager": lambda: fn(*args),
            "graph": replaying(lambda: fn(*args)),
        }
        row = {k: _per_call(f, calls, clock=clock) for k, f in timed.items()}
        row["exe-idle"] = _idle_call(timed["exe"], calls, clock)
        row.update(_frame(fn, args, calls, clock, timed["exe"]))    # (last: it resets Dynamo)
    row["overhead"] = row["compiled"] - row["exe"]
    row["over-idle"] = row["compiled"] - row["exe-idle"]
    row["over-cold"] = row["compiled"] - row["exe-cold"]
    row["graph-exe"] = row["graph"] - row["exe"]
    return row


def run(calls: int = 2000, out=print, clock: str = "wall") -> list[dict]:
    rows = []
    cols = ["compiled", "frame", "guards", "aot", "program", "jit", "exe", "exe-idle", "exe-cold", "eager",
            "graph", "overhead", "over-idle", "over-cold", "graph-exe"]
    out(f"{'case':<15}" + "".join(f"{c:>10}" for c in cols) + "   (µs per call)")
    for name, (fn, args) in _cases().items():
        row = measure(name, fn, args, calls, clock)
        rows.append({"case": name, **row})
        out(f"{name:<15}" + "".join(f"{row[c]:>10.1f}" for c in cols))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--clock", choices=list(CLOCKS), default="wall")
    a = p.parse_args()
    run(a.calls, clock=a.clock)


if __name__ == "__main__":
    main()
