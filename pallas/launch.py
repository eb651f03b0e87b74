"""How every kernel in this package calls ``pl.pallas_call``, and the padding they share.

``pallas_call`` adds the project's rules to JAX's: the kernel body and its index maps are
traced with ``jax_enable_x64`` off (the runtime turns x64 on for torch semantics; Mosaic
takes no 64-bit index or float), interpret mode and the chip come from one
``tpu_info.Target``, the scoped VMEM limit is raised when the kernel's own estimate needs
more than the chip's default, and every call carries a name and a ``pl.CostEstimate`` so
XLA can schedule around it and the compiler's reports can show a roofline for it.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info

# Mosaic's own scratch and the body's temporaries ride on top of the block arithmetic.
_HEADROOM = 4 / 3
# The most of a core's VMEM one kernel may claim: the rest belongs to XLA's fusions.
_LIMIT_SHARE = 3 / 4


def vmem_limit(chip: tpu_info.Chip, vmem_bytes: int) -> int | None:
    """The ``vmem_limit_bytes`` a kernel with ``vmem_bytes`` of blocks needs on ``chip``:
    None when the default scoped limit suffices, else the estimate plus headroom (never
    past 3/4 of the physical VMEM: the rest belongs to XLA's fusions)."""
    need = int(vmem_bytes * _HEADROOM)
    if need <= chip.scoped_vmem_bytes:
        return None
    return min(tpu_info.round_up(need, tpu_info.MiB), int(chip.vmem_bytes * _LIMIT_SHARE))


def max_vmem_bytes(chip: tpu_info.Chip) -> int:
    """The largest block footprint (``vmem_bytes``) ``vmem_limit`` can raise the limit for:
    what tuned blocks, compiled and checked for ``chip``, may take."""
    return int(chip.vmem_bytes * _LIMIT_SHARE / _HEADROOM)


def cost(flops: float, bytes_accessed: float, transcendentals: float = 0) -> pl.CostEstimate:
    """A ``pl.CostEstimate`` from (possibly float) counts."""
    return pl.CostEstimate(flops=int(flops), transcendentals=int(transcendentals),
                           bytes_accessed=int(bytes_accessed))


def pallas_call(kernel: Callable[..., None], *, target: tpu_info.Target, name: str,
                cost_estimate: pl.CostEstimate, vmem_bytes: int,
                dimension_semantics: Sequence[str], **kwargs: Any) -> Callable[..., Any]:
    """``pl.pallas_call(kernel, **kwargs)`` for ``target``, traced in 32-bit.

    ``vmem_bytes`` is the kernel's block arithmetic (blocks x buffers + scratch +
    temporaries) on ``target.chip``; it decides ``vmem_limit_bytes``.
    """
    params = pltpu.CompilerParams(dimension_semantics=tuple(dimension_semantics),
                                  vmem_limit_bytes=vmem_limit(target.chip, vmem_bytes))
    call = pl.pallas_call(kernel, name=name, cost_estimate=cost_estimate,
                          compiler_params=params, interpret=target.interpret, **kwargs)

    def run(*args: Any) -> Any:
        with jax.enable_x64(False):
            return call(*args)
    return run


def pad_to(x: jax.Array, shape: Sequence[int], value: Any = 0) -> jax.Array:
    """``x`` zero- (or ``value``-) padded at the end of each dim up to ``shape``."""
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return jnp.pad(x, [(0, t - s) for s, t in zip(x.shape, shape)], constant_values=value)
