"""Compile for a TPU chip on a machine without one: XLA:TPU and Mosaic from libtpu's
compile-only topologies.

    from tpu_kernels import aot
    c = aot.compile(fn, jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16), chip="v6e")
    print(c.summary.format())     # HBM, XLA's estimate, each Mosaic kernel and its VMEM

``aot.check_kernels()`` compiles every shipped kernel at production shapes for v5e, v6e
and v7x; ``aot.check_impls()`` does so for the registry's Pallas/Helion impls (the
coverage report's "compiles on" column). ``tpu_kernels.aot.training`` compiles a model's
training step (``python -m tpu_kernels aot --model``). Needs
``pip install tpu_kernels[aot]`` (libtpu); nothing else in the library imports this.
See docs/aot.md.
"""
from tpu_kernels.aot.check import Result, check, check_kernels, table
from tpu_kernels.aot.compiler import Compiled, compile, compile_lowered, explain, warm
from tpu_kernels.aot.impls import ImplResult, check_impls
from tpu_kernels.aot.summary import Kernel, Summary
from tpu_kernels.aot.topology import Unavailable, device, on_chip, spec, unavailable_reason

__all__ = ["Compiled", "ImplResult", "Kernel", "Result", "Summary", "Unavailable", "check",
           "check_impls", "check_kernels", "compile", "compile_lowered", "device", "explain", "on_chip", "spec",
           "table", "unavailable_reason", "warm"]
