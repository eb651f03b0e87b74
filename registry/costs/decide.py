"""Kernel or XLA: the registry's choice on a TPU, backed by numbers.

A Pallas/Helion impl that accepts the arguments runs only where its modelled time
(``kernel_model``) beats XLA's estimate for the op's XLA lowering (``xla_table``).
Decisions are cached per (impl, chip, exact argument shapes).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from tpu_kernels.registry.costs import kernel_model, xla_table
from tpu_kernels.registry.costs.program import program

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Decision:
    """A kernel impl against the XLA lowering of its op, on one chip."""
    kernel: str                  # "pallas:mm"
    chip: str
    kernel_seconds: float        # modelled
    xla_seconds: float           # the real compiler's estimate (see ``source``)
    source: str                  # where the XLA figure comes from: compiled | class | fallback
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
        return (f"cost on {self.chip}: {self.kernel} {_us(self.kernel_seconds)} modelled, XLA "
                f"{_us(self.xla_seconds)} ({self.source}): {who} {by:.2f}x faster")


def _us(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


_CACHE: dict[tuple, Decision | None] = {}
_LOCK = threading.Lock()


def decide(op: Any, impl: Any, xla_impl: Any, args: tuple, kwargs: dict, chip: str) -> Decision | None:
    """``impl`` against ``xla_impl`` for these (meta) arguments on ``chip``; None when the
    kernel cannot be modelled (it then runs, as it did before the cost model)."""
    ck = (id(impl), id(xla_impl), chip, xla_table.signature(args, kwargs, bucket=False), repr(kwargs))
    with _LOCK:
        if ck in _CACHE:
            return _CACHE[ck]
    decision = _decide(op, impl, xla_impl, args, kwargs, chip)
    with _LOCK:
        _CACHE[ck] = decision
    return decision


def _decide(op: Any, impl: Any, xla_impl: Any, args: tuple, kwargs: dict, chip: str) -> Decision | None:
    try:
        kfn, specs = program(op, impl, args, kwargs)
        modelled = kernel_model.model(kfn, specs, chip)
        xfn, xspecs = program(op, xla_impl, args, kwargs)
        useful = xla_table.ideal_seconds(xfn, xspecs, chip)
    except Exception as exc:   # a kernel the model cannot trace keeps today's behaviour
        log.debug("cost model cannot judge %s on %s: %s", impl, chip, exc)
        return None
    if modelled.kernels == 0:
        return None            # no Pallas call traced (a Helion path the walk cannot see)
    est = xla_table.estimate(op.name(), chip, args, kwargs, useful)
    return Decision(f"{impl.kind}:{impl.name}", chip, modelled.seconds, est.seconds, est.source,
                    useful, modelled)
