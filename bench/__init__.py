"""Per-kernel microbenchmarks: ``python -m tpu_kernels bench``.

Each module in ``defs/`` declares ``BENCHMARKS: list[KernelBench]`` (see ``spec.py``).
"""
