"""XLA lowerings: one module per op family, a short pure-JAX function per op."""
from tpu_kernels.registry.xla import (  # noqa: F401  (each module registers its lowerings)
    creation,
    elementwise,
)
