"""A training step's compiled programs run as one XLA executable: opt-in
(``TPU_KERNELS_COMPILE_DEFER=1``).

Off by default, because on the CPU backend it loses more than it saves: recorded, the
step's programs start only once the whole step's Python has run, where run one by one each
starts as soon as it is called and runs while the Python of the next is going. Interleaved
A/B in one process (2 cores, median step): the small GPT 6.25 ms recorded vs 3.73 ms one by
one (hand-written JAX: 2.44), the medium GPT 160.6 vs 146.0 ms, a 2-layer transformers
Llama with its own ``.loss`` 8.15 vs 5.16 ms and with an eager loss 8.65 vs 6.57 ms.
Running the recording when backward returns (the optimizer's Python then overlaps the
forward and backward) recovered only part: 5.0, 159.2, 7.53 and 7.85 ms. On a TPU v5e
it did not pay either: the small GPT's compiled step 5.22 ms recorded vs 5.08 ms one by
one (hand-written JAX 0.97 ms; ``bench/results/tpu_v5e/2026-12-04-s23.md``), and again
later: small 4.9 vs 3.7 ms, medium 9.8 vs 6.1 ms (``2026-12-06-s35.md``: about the
host-bound step plus its device time, which one by one overlaps the next program's Python).

A compiled training step is several programs: the forward graph (``loss = cm(x)``), the
backward graph (``loss.backward()``) and, with ``torch.compile(opt.step)``, the
optimizer's graph. Run one by one, each pays a launch, its arguments' handling and a
dispatch of its own; hand-written JAX jits the whole step as one function. So a
``StepProgram`` does not run its jitted function at once: it records it (``lazy.record``,
the machinery of deferred mode) and returns tpu tensors over ``Lazy`` placeholders, and
recording stays on until the next flush (``lazy.record_until_flush``), so eager ops on
the outputs (a loss computed eagerly, backward's seed gradient) are recorded too. The
next program of the step records after it (its inputs may be the placeholders: the
forward's saved activations, the gradients), and the recording runs as one jitted
program, into which XLA inlines the programs, when a value is needed: reading any output
(``.item()``, ``.cpu()``, printing, an op that cannot be recorded), the next step's
forward, a recording grown past ``lazy.UNTIL_FLUSH_MAX_NODES``, or any flush of deferred
mode. Outputs nobody holds by then (activations the backward used) never leave the
executable. Semantics are eager's: every observable read forces the run.

A program records only once it has been traced for its argument signature (the first
call runs it), and only where a fusion can follow: the forward and backward graphs of
training, and inference graphs that write their inputs (an optimizer step). Every
program is traced with recording paused (its ops run on the trace's values).
``TPU_KERNELS_COMPILE_DEFER=1`` turns the recording on (by default each program runs at
once).

A recording pays only when it repeats: one whose eager ops change shape every call (the
token ids that ``generate()`` grows by one per step around the compiled decode step)
compiles the whole fused program each time. So a program whose last ``MAX_NEW_FUSIONS``
recordings each compiled a new program stops recording and runs at once.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable

from tpu_kernels import devices, errors, lazy
from tpu_kernels.graph_program import GraphProgram, copied_inputs

log = logging.getLogger("tpu_kernels.compile_step")
ON = os.environ.get("TPU_KERNELS_COMPILE_DEFER", "0") not in ("", "0")   # opt-in: see above
MAX_NEW_FUSIONS = 8   # recordings in a row that compiled anew, before a program runs at once


class StepProgram(GraphProgram):
    """A ``GraphProgram`` that is traced with recording paused (its ops run on the trace's
    values even while a recording is open) and, where ``defers``, whose calls after the
    first are recorded, not run (see above). ``starts_step``: a forward graph, whose call
    first runs what an earlier step left recorded (a loop that never reads a value still
    runs one step per executable)."""

    def __init__(self, *args: Any, defers: bool = True, starts_step: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a program a hook jits its own way (collectives over a mesh), or one among several
        # devices, runs at once: a recording holds one device's plain programs
        own_jit = getattr(self._jitted, "__wrapped__", None) == self._trace
        self.defers = defers and own_jit and not devices.several
        self.starts_step = starts_step
        self._recorders: dict[tuple, Callable] = {}   # statics -> the recorded function
        self._new_fusions = 0     # recordings in a row whose program was compiled anew
        self._plain: Callable | None = None   # the jitted function recordings call: donates nothing

    def _trace(self, statics: tuple, key: Any, *arrays: Any, count: bool = True) -> Any:
        with lazy.paused():
            return super()._trace(statics, key, *arrays, count=count)

    def _run_jitted(self, args: tuple, sources: list) -> list[Any]:
        if not self.defers or not ON:
            return super()._run_jitted(args, sources)
        statics = self._statics(args, sources)
        known = self._recorders.get(statics)
        if known is None:
            if statics not in self._outputs or self.eager:
                return super()._run_jitted(args, sources)     # traces (or runs) now
            known = self._recorders[statics] = self._recorder(statics)
        if known is _RUN_NOW:
            return super()._run_jitted(args, sources)
        fn, (layout, checks) = known
        if self.starts_step:
            lazy.flush()
        taken = self.n_random
        key = self._key(taken)
        storages, flags = lazy.record(fn, key, *self.arguments([st.array for st, _ in sources]),
                                      watcher=self._flushed)
        lazy.record_until_flush()
        for f, (op, c) in zip(flags, checks):
            errors.watch(f, op, c)
        return self._results(layout, sources, storages)

    def _flushed(self, compiled: bool) -> None:
        """A recording holding this program ran: past ``MAX_NEW_FUSIONS`` new programs in a
        row, recording does not pay here (what surrounds it never repeats)."""
        self._new_fusions = self._new_fusions + 1 if compiled else 0
        if self._new_fusions >= MAX_NEW_FUSIONS:
            self.defers = False
            log.info("a compiled graph's last %d recordings each compiled a new program: "
                     "it runs on its own from now on", MAX_NEW_FUSIONS)

    def _recorder(self, statics: tuple) -> Any:
        """(the recorded function, its outputs' layout) for a signature, or ``_RUN_NOW``
        where the program writes a CPU input on the device (the caller reads it back at
        once, so nothing would be deferred)."""
        layout = self._outputs[statics]
        written = {k for k, _ in layout[0][0]}
        host = self.host.written if self.host is not None else set()
        if any(k in written and k not in host for k in self.cpu_inputs):
            return _RUN_NOW
        if self._plain is None:   # a recording's inputs are not checked as a call's are
            self._plain = self._jit(donate=False) if self.donated else self._jitted
        return _bound(self._plain, statics), layout


_RUN_NOW = object()


def _bound(jitted: Callable, statics: tuple) -> Callable:
    """``jitted`` with its static arguments bound: one stable function per signature, so
    recordings made of it are cached (``lazy`` keys programs by their functions)."""
    def run(key: Any, *arrays: Any) -> Any:
        return jitted(statics, key, *arrays)
    return run


def program_for(role: str, gm: Any, example_inputs: Any, options: Any) -> GraphProgram:
    """The program for one of AOTAutograd's graphs: it defers for a training graph's
    forward and backward and for an inference graph that writes its inputs."""
    defers = role != "inference" or bool(copied_inputs(gm))
    return StepProgram(gm, example_inputs, options, defers=defers, starts_step=role == "forward")

