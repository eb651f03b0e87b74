"""Hand-written Pallas TPU kernels: pure JAX, no torch.

Each kernel module holds the kernel body, its BlockSpecs and grid, a wrapper, and a
``supports(...)`` that returns ``None`` when the arguments are in range or a reason
string when they are not. References (plain ``jax.numpy``) live in ``reference/``.
Where a kernel runs and which chip it sizes its blocks for is ``tpu_info.target()``: on a
TPU, Mosaic for that chip; inside ``tpu_info.compile_for(chip)`` (``tpu_kernels.aot``),
Mosaic for the named chip; elsewhere interpret mode. Every kernel calls
``launch.pallas_call`` (32-bit tracing, a name, a cost estimate, its VMEM limit).
"""
