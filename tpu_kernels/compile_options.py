"""What ``torch.compile(..., backend="tpu", mode=..., options=...)`` does with each setting.

Every graph becomes one XLA executable whatever the mode, so the modes differ in nothing:

- ``"default"``, ``"reduce-overhead"``: the program is already one device launch per graph
  (what CUDA graphs buy inductor), and its arguments are the tensors' storages, no copies.
  What is left per call is Python (Dynamo's frame and guards, AOTAutograd, autograd);
  ``torch.tpu.graph`` captures a whole step and replays it without any (``graphs.py``).
- ``"max-autotune"``, ``"max-autotune-no-cudagraphs"``: XLA fuses and schedules the whole
  graph itself; each Pallas/Helion kernel runs with the block sizes its ``supports``/config
  picks for the chip (the same choice as eager).

``options`` (the ``tpu`` backend's own):

- ``interpret`` (bool): Pallas/Helion kernels in these graphs run in interpret mode (off TPU).
- ``disable`` (kind names): impls of these kinds never run in these graphs
  (``{"disable": ["pallas", "helion"]}``: XLA lowerings only).

inductor's options (``"triton.cudagraphs"``, ``"max_autotune"``, ``"epilogue_fusion"``...) are
accepted so code written for inductor runs unchanged; they do nothing here (logged once).
Any other name is an error naming the ones that exist.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from typing import Any, Iterator

import torch

from tpu_kernels.registry import REGISTRY
from tpu_kernels.registry.kinds import SWITCHABLE_KINDS

log = logging.getLogger(__name__)

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
OPTIONS = {"interpret": "Pallas/Helion kernels run in interpret mode (off TPU)",
           "disable": f"impl kinds that never run in these graphs, of {list(SWITCHABLE_KINDS)}"}


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """The settings a ``tpu`` graph is traced under (part of its programs' keys)."""
    mode: str = "default"
    interpret: bool | None = None
    disable: tuple[str, ...] = ()

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """The registry switches these options ask for, while a graph is traced."""
        with contextlib.ExitStack() as stack:
            if self.interpret is not None:
                stack.enter_context(REGISTRY.interpret(self.interpret))
            if self.disable:
                stack.enter_context(REGISTRY.disable(*self.disable))
            yield


def parse(mode: str | None = None, options: dict[str, Any] | None = None) -> CompileOptions:
    """``torch.compile``'s ``mode`` and ``options`` for the ``tpu`` backend, checked."""
    mode = mode or "default"
    if mode not in MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(MODES)}")
    options = dict(options or {})
    ignored = sorted(k for k in options if k not in OPTIONS and _is_inductor_option(k))
    unknown = sorted(k for k in options if k not in OPTIONS and k not in ignored)
    if unknown:
        raise RuntimeError(
            f"Unexpected optimization option(s) {unknown} for backend 'tpu'; its options are "
            + "; ".join(f"{k}: {v}" for k, v in OPTIONS.items()))
    if ignored:
        log.info("backend 'tpu' ignores inductor's option(s) %s: XLA compiles each graph", ignored)
    interpret = options.get("interpret")
    disable = tuple(options.get("disable", ()))
    bad = [k for k in disable if k not in SWITCHABLE_KINDS]
    if bad:
        raise ValueError(f"options['disable']: unknown impl kind(s) {bad}; kinds: {list(SWITCHABLE_KINDS)}")
    return CompileOptions(mode, None if interpret is None else bool(interpret), disable)


@functools.cache
def _inductor_options() -> frozenset[str]:
    # torch loads inductor (and Dynamo) at this first attribute access: a compile is
    # being set up, so they are loaded already; importing this module does not load them
    return frozenset(torch._inductor.config.get_config_copy())


def _is_inductor_option(name: str) -> bool:
    return name in _inductor_options()
