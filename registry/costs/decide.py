"""Kernel or XLA: the registry's choice on a TPU, backed by numbers.

A Pallas/Helion impl that accepts the arguments runs only where it is faster than the op's
XLA lowering: as measured on the chip (``measured``: the call's shapes or their shape class)
where that was done, else by its modelled time (``kernel_model``) against XLA's estimate
(``xla_table``). Decisions are cached per (impl, chip, exact argument shapes).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from tpu_kernels.registry.costs import kernel_model, measured, xla_table
from tpu_kernels.registry.costs.program import program

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Decision:
    """A kernel impl against the XLA lowering of its op, on one chip."""
    kernel: str                  # "pallas:mm"
    chip: str
    kernel_seconds: float        # modelled, or measured (see ``source``)
    xla_seconds: float           # the real compiler's estimate, or measured
    source: str                  # where the figures come from: measured | measured class (both
                                 # measured on the chip), or XLA's: compiled | class | fallback
    useful_seconds: float        # the op's ideal time on the chip (``xla_table.ideal_seconds``)
    modelled: kernel_model.Modelled | None = None

    @property
    def kernel_wins(self) -> bool:
        return self.kernel_seconds < self.xla_seconds

    @property
    def ratio(self) -> float:
        """XLA's time over the kernel's: > 1 where the kernel wins."""
        return self.xla_seconds / self.kernel_seconds if self.kernel_seconds else float("inf")

    def reason(self) -> str:
        who, by = ("kernel", self.ratio) if self.kernel_wins else ("XLA", 1 / self.ratio if self.ratio else 0.0)
        if self.source.startswith("measured"):
            return (f"cost on {self.chip}: {self.kernel} {_us(self.kernel_seconds)}, XLA "
                    f"{_us(self.xla_seconds)} ({self.source} on the chip): {who} {by:.2f}x faster")
        return (f"cost on {self.chip}: {self.kernel} {_us(self.kernel_seconds)} modelled, XLA "
                f"{_us(self.xla_seconds)} ({self.source}): {who} {by:.2f}x faster")


def _us(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


_CACHE: dict[tuple, Decision | None] = {}
_LOCK = threading.Lock()


def decide(op: Any, impl: Any, xla_impl: Any, args: tuple, kwargs: dict, chip: str) -> Decision | None:
    """``impl`` against ``xla_impl`` for these (meta) arguments on ``chip``: measured where
    the call or its shape class was, else modelled; None when neither can judge (the kernel
    then runs, as it did before the cost model)."""
    ck = (id(impl), id(xla_impl), chip, xla_table.signature(args, kwargs, bucket=False), repr(kwargs))
    with _LOCK:
        if ck in _CACHE:
            return _CACHE[ck]
    decision = modelled(op, impl, xla_impl, args, kwargs, chip)
    name = f"{impl.kind}:{impl.name}"
    found = measured.lookup(op, name, chip, args, kwargs, decision.useful_seconds if decision else None)
    if found is not None:     # (also where the model cannot see the kernel: a Helion path)
        decision = Decision(name, chip, found[0], found[1], found[2],
                            decision.useful_seconds if decision else 0.0, decision and decision.modelled)
    with _LOCK:
        _CACHE[ck] = decision
    return decision


def modelled(op: Any, impl: Any, xla_impl: Any, args: tuple, kwargs: dict, chip: str) -> Decision | None:
    """The cost model's own decision (no measurements); None where it cannot judge."""
    try:
        kfn, specs = program(op, impl, args, kwargs)
        kernel = kernel_model.model(kfn, specs, chip)
        xfn, xspecs = program(op, xla_impl, args, kwargs)
        useful = xla_table.ideal_seconds(xfn, xspecs, chip)
    except Exception as exc:   # a kernel the model cannot trace keeps today's behaviour
        log.debug("cost model cannot judge %s on %s: %s", impl, chip, exc)
        return None
    if kernel.kernels == 0:
        return None            # no Pallas call traced (a Helion path the walk cannot see)
    est = xla_table.estimate(op.name(), chip, args, kwargs, useful)
    return Decision(f"{impl.kind}:{impl.name}", chip, kernel.seconds, est.seconds, est.source,
                    useful, kernel)
