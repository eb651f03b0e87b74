"""Which JAX backends to start, decided before JAX starts any.

libtpu (installed for the compile-only TPU compiler, ``tpu_kernels.aot``) registers JAX's
TPU plugin. On a machine without TPU chips, starting that backend fails only after
libtpu's host and metadata-server probes (minutes on a busy machine, and the
``/tmp/libtpu_lockfile`` serialises concurrent processes), and JAX then runs on the CPU
anyway. Compile-only topologies do not need the backend started. So where no TPU chip is
attached and the user named no platforms, JAX is told to start without the TPU backend.
``JAX_PLATFORMS`` set by the user always wins.
"""
from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import sys

# Where Cloud TPU VMs attach their chips: /dev/accel* (v2-v5e), /dev/vfio/N (v5p, v6e, v7x)
_TPU_DEVICE_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*")
_GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin")


def tpu_attached() -> bool:
    """True when this host has TPU chips (their device files exist)."""
    return any(glob.glob(pattern) for pattern in _TPU_DEVICE_FILES)


def choose_platforms() -> str | None:
    """Set ``JAX_PLATFORMS`` (and JAX's config, if JAX is imported but has not started a
    backend) to skip the TPU backend on a host without TPU chips; returns what was set."""
    if os.environ.get("JAX_PLATFORMS") or tpu_attached() or importlib.util.find_spec("libtpu") is None:
        return None
    gpus = [p for p in _GPU_PLUGINS if importlib.util.find_spec(p) is not None]
    platforms = ",".join((["cuda"] if any("cuda" in p for p in gpus) else [])
                         + (["rocm"] if any("rocm" in p for p in gpus) else []) + ["cpu"])
    os.environ["JAX_PLATFORMS"] = platforms
    if "jax" in sys.modules:     # imported first by the user: the env var was read already
        from jax._src import xla_bridge
        if not xla_bridge._backends:
            sys.modules["jax"].config.update("jax_platforms", platforms)
    return platforms


def dynamo_backend_installed() -> bool:
    """True when this package's metadata names its torch.compile backend (the
    ``torch_dynamo_backends`` entry point ``tpu``), so torch finds it without an import."""
    try:
        eps = importlib.metadata.distribution("tpu_kernels").entry_points
    except importlib.metadata.PackageNotFoundError:
        return False
    return any(ep.group == "torch_dynamo_backends" and ep.name == "tpu" for ep in eps)
