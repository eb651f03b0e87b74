"""Helion kernels compiled by Helion's Pallas backend, called from JAX via ``Kernel.jax_fn``.

One module per family (rms_norm, layer_norm, softmax, glu, rope, var_mean, cumsum, topk);
each exposes JAX-facing functions plus ``supports(...)`` returning None or a reason.
Kernels are compiled with fixed configs per shape class, lazily, and run in Pallas
interpret mode off TPU unless ``tpu_info.compile_for(chip)`` (``tpu_kernels.aot``) asks
for Mosaic (see ``_common``). Helion is only imported when a kernel is first launched.
"""
from ._common import COMPILE_TIMES, interpret_mode

__all__ = ["COMPILE_TIMES", "interpret_mode"]
