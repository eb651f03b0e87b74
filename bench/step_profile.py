"""Where one compiled training step of the small GPT spends its time.

    python -m tpu_kernels.bench.step_profile [--size small] [--steps 20]

The step is ``bench/graph_modes.py``'s "tpu compiled" step (a compiled ``model.loss``,
``loss.backward()``, a compiled ``opt.step``). Reported per step (medians over
``--steps`` steps after warm-up): wall time and the process's CPU time of the step, time
in each compiled program's call (``GraphProgram.__call__``) and in its jitted function,
the Python time outside them, each program's executable alone and the arrays it returns
(on a TPU host an output costs ~5x an input: ``call_anatomy.py``), the executables XLA
ran (jitted calls, counted through JAX's Python path: a separate counting step with JAX's
C++ fast path off) and the host syncs (a jax array read to the host or waited on). And,
for comparison, the same for the hand-written JAX step (``bench/jax_gpt.py``).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import torch

from tpu_kernels import graph_program, lazy
from tpu_kernels.bench import graph_modes, jax_gpt
from tpu_kernels.bench.timing import sync
from tpu_kernels.models import GPT


class _Clock:
    """Per-step totals of named stretches (wall seconds, CPU seconds of the thread that
    ran them) and counts."""

    def __init__(self) -> None:
        self.wall: collections.Counter = collections.Counter()
        self.cpu: collections.Counter = collections.Counter()   # the span's thread's CPU time
        self.count: collections.Counter = collections.Counter()

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.wall[name] += time.perf_counter() - t0
            self.cpu[name] += time.thread_time() - c0
            self.count[name] += 1


@contextlib.contextmanager
def _instrumented(clock: _Clock) -> Iterator[None]:
    """Times every ``GraphProgram`` call and its jitted function's call (the packed one
    where its small state is packed, ``program_packs.py``)."""
    program = graph_program.GraphProgram
    call, run, packed = program.__call__, program._run_jitted, program._packed_jit

    def timed_call(self, *args):
        with clock.span(f"program {_name(self)}"):
            return call(self, *args)

    def timed(self, jitted, donated):
        def jit_call(*a):
            if _keeping[0]:   # (an untimed step) copies: the call gives up what it donates
                _last[_name(self)] = (jitted, _copies(a), donated)
            with clock.span(f"  jit call {_name(self)}"):
                return jitted(*a)
        return jit_call

    def timed_run(self, args, sources):
        jitted = self._jitted
        self._jitted = timed(self, jitted, self.donated_argnums())
        try:
            return run(self, args, sources)
        finally:
            self._jitted = jitted

    def timed_packed(self, donated):
        return timed(self, packed(self, donated), (3, *(4 + i for i in donated)))
    run_on, flush = lazy.run_on, lazy.flush

    def timed_flush():
        with clock.span("lazy flush (the run included)"):
            return flush()

    def timed_run_on(index, fn, inputs):
        _last["recorded step"] = (fn, inputs, ())
        with clock.span("  run of the recording (lazy flush)"):
            return run_on(index, fn, inputs)
    program.__call__, program._run_jitted, program._packed_jit = timed_call, timed_run, timed_packed
    lazy.run_on, lazy.flush = timed_run_on, timed_flush
    try:
        yield
    finally:
        program.__call__, program._run_jitted, program._packed_jit = call, run, packed
        lazy.run_on, lazy.flush = run_on, flush


def _name(program: Any) -> str:
    n = sum(1 for nd in program.gm.graph.nodes if nd.op == "placeholder")
    return f"#{_ids.setdefault(id(program), len(_ids))} ({n} inputs)"


_ids: dict[int, int] = {}
_last: dict[str, tuple] = {}     # program -> (its jitted function, arguments of a call, donated positions)
_keeping = [False]               # whether program calls keep their arguments in _last
_outputs: dict[str, int] = {}    # program -> arrays its jitted function returns (exe_times)


def _copies(args: tuple) -> tuple:
    return tuple(jax.tree.map(lambda x: jnp.array(x, copy=True), a) if hasattr(a, "shape") or type(a) is list
                 else a for a in args)


def _with_copies(args: tuple, positions: tuple) -> tuple:
    """``args`` with copies at ``positions`` (the arguments a call donates)."""
    return tuple(jax.tree.map(lambda x: jnp.array(x, copy=True), a) if i in positions else a
                 for i, a in enumerate(args))


def exe_times(reps: int = 30) -> dict[str, float]:
    """Seconds per call of each program's jitted function alone: ``reps`` calls back to
    back on the arguments of an untimed step's call (new copies of the donated ones, made
    beforehand), waited for once, as calls follow each other in a step. (Each call waited
    for on its own would time XLA:CPU's worker waking up and a wait per output as well.)"""
    out = {}
    for name, (fn, args, donated) in _last.items():
        jax.block_until_ready(fn(*_with_copies(args, donated)))
        calls = [_with_copies(args, donated) for _ in range(reps)]
        jax.block_until_ready(calls)     # (the copies are made before the clock starts)
        t0 = time.perf_counter()
        for call_args in calls:
            result = fn(*call_args)
        jax.block_until_ready(result)
        out[name] = (time.perf_counter() - t0) / reps
        _outputs[name] = len(jax.tree.leaves(result))
    return out


@contextlib.contextmanager
def _counted(counts: collections.Counter) -> Iterator[None]:
    """Counts executables run (JAX's C++ fast path off, so each goes through Python) and
    host syncs (an array's value read or waited on)."""
    from jax._src import array, pjit
    from jax._src.interpreters import pxla
    fast, execute = pjit._get_fastpath_data, pxla.ExecuteReplicated.__call__
    value, ready = array.ArrayImpl._value, array.ArrayImpl.block_until_ready

    def counted_execute(self, *args):
        counts[f"executable {self.name}"] += 1
        return execute(self, *args)

    def counted_value(self):
        if self._npy_value is None:
            counts["host read (array value)"] += 1
        return value.fget(self)

    def counted_ready(self):
        counts["block_until_ready"] += 1
        return ready(self)
    pjit._get_fastpath_data = lambda *a, **k: None
    jax.clear_caches()     # drops the C++ fast path's entries (the step compiles again)
    pxla.ExecuteReplicated.__call__ = counted_execute
    array.ArrayImpl._value = property(counted_value)
    array.ArrayImpl.block_until_ready = counted_ready
    try:
        yield
    finally:
        pjit._get_fastpath_data, pxla.ExecuteReplicated.__call__ = fast, execute
        array.ArrayImpl._value, array.ArrayImpl.block_until_ready = value, ready
        jax.clear_caches()  # entries made meanwhile have no fast path: later calls would lack it


def profile(step: Callable[[], Any], steps: int, out=print) -> dict:
    for _ in range(4):
        sync(step())
    clock = _Clock()
    walls, cpus, spans = [], [], collections.defaultdict(list)
    thread_cpu = collections.defaultdict(list)
    with _instrumented(clock):
        for _ in range(steps):
            clock.wall.clear()
            clock.cpu.clear()
            w0, c0 = time.perf_counter(), time.process_time()
            loss = step()
            w1, c1 = time.perf_counter(), time.process_time()
            sync(loss)
            walls.append(time.perf_counter() - w0)
            cpus.append(c1 - c0)
            spans["dispatch (until the step returns)"].append(w1 - w0)
            for k, v in clock.wall.items():
                spans[k].append(v)
                thread_cpu[k].append(clock.cpu[k])
        _keeping[0] = True      # one more step, untimed, keeps each program's arguments
        try:
            sync(step())
        finally:
            _keeping[0] = False
    exe = exe_times()    # (before the counting steps, which compile the programs again)
    counts: collections.Counter = collections.Counter()
    with _counted(counts):
        sync(step())
        counts.clear()
        sync(step())
    med = {k: statistics.median(v) for k, v in spans.items()}
    med_cpu = {k: statistics.median(v) for k, v in thread_cpu.items()}
    programs = sum(v for k, v in med.items() if k.startswith("program"))
    out(f"step wall (synced) {statistics.median(walls) * 1e3:8.3f} ms   "
        f"CPU time while dispatching {statistics.median(cpus) * 1e3:8.3f} ms")
    out(f"  {'span':<44} {'wall':>8}    {'thread CPU':>10}")
    for k in sorted(med):
        cpu = f"{med_cpu[k] * 1e3:8.3f} ms" if k in med_cpu else ""
        out(f"  {k:<44} {med[k] * 1e3:8.3f} ms {cpu}")
    out(f"  {'Python outside programs (dispatch - programs)':<44} "
        f"{(med['dispatch (until the step returns)'] - programs) * 1e3:8.3f} ms")
    for k, v in exe.items():
        out(f"  {'exe alone ' + k:<44} {v * 1e3:8.3f} ms")
    for k, n in _outputs.items():       # (an output costs ~5x an input on a TPU v5e host)
        out(f"  {'outputs of ' + k:<44} {n:8d}")
    out(f"  {'exe alone, all programs':<44} {sum(exe.values()) * 1e3:8.3f} ms")
    for k, n in sorted(counts.items()):
        out(f"  {k:<60} x{n}")
    return {"wall": statistics.median(walls), "spans": med, "counts": dict(counts)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--modes", default="tpu compiled,jax jit")
    a = p.parse_args()
    cfg, batch = graph_modes.SIZES[a.size]
    torch.manual_seed(0)
    model = GPT(cfg)
    tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1))
    for mode in a.modes.split(","):
        print(f"\n{mode}, {a.size}:")
        _last.clear()
        _outputs.clear()
        if mode == "jax jit":
            _, jstep = jax_gpt.jitted(cfg.layers, cfg.heads)
            params = jax_gpt.params_from(model)
            _last["jax step"] = (jstep, (params, jax_gpt.init_state(params), jax_gpt.tokens_from(tokens)), (0, 1))
        profile(graph_modes._train_step(mode, model, tokens), a.steps)
    jax.clear_caches()


if __name__ == "__main__":
    main()
