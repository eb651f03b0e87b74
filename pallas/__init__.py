"""Hand-written Pallas TPU kernels: pure JAX, no torch.

Each kernel module holds the kernel body, its BlockSpecs and grid, a wrapper, and a
``supports(...)`` that returns ``None`` when the arguments are in range or a reason
string when they are not. References (plain ``jax.numpy``) live in ``reference/``.
Off TPU the kernels run in interpret mode (``interpret=None`` picks it).
"""
