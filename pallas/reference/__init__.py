"""Plain jax.numpy references for the Pallas kernels, used by their unit tests."""
