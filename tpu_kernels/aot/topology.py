"""Compile-only TPU devices from libtpu (no TPU needed): one per chip in ``tpu_info.CHIPS``.

libtpu (``pip install tpu_kernels[aot]``, pinned to the release jax pairs with) gives
topologies such as ``v6e:2x2`` whose devices JAX can compile for but not run on. Nothing
here runs at import: libtpu is loaded the first time a device is asked for, with the
environment it needs on a machine without a TPU (no metadata server, and several
processes at once, e.g. pytest-xdist workers, each holding its own copy).
"""
from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

import jax

from tpu_kernels.pallas import tpu_info

_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",            # no GCE metadata server to ask for the TPU type
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",    # no exclusive /tmp/libtpu_lockfile per process
    "TPU_STDERR_LOG_LEVEL": "3",          # libtpu's warnings about hostnames are harmless
    "TPU_MIN_LOG_LEVEL": "3",
}


class Unavailable(RuntimeError):
    """libtpu is not installed (or cannot load): no TPU compiler on this machine."""


def unavailable_reason() -> str | None:
    """None when TPU programs can be compiled here, else why not."""
    if importlib.util.find_spec("libtpu") is None:
        return "libtpu is not installed: pip install 'tpu_kernels[aot]' (libtpu==0.0.42.*)"
    return None


@functools.cache
def device(chip: str | tpu_info.Chip) -> Any:
    """The first device of ``chip``'s compile-only topology (e.g. ``v6e:2x2``)."""
    row = tpu_info.chip(chip)
    reason = unavailable_reason()
    if reason:
        raise Unavailable(reason)
    for key, value in _ENV.items():
        os.environ.setdefault(key, value)
    from jax.experimental.topologies import get_topology_desc
    try:
        return get_topology_desc(platform="tpu", topology_name=row.topology).devices[0]
    except Exception as exc:  # noqa: BLE001  (plugin load errors come as several types)
        raise Unavailable(f"libtpu could not describe {row.topology!r}: {exc}") from exc


def sharding(chip: str | tpu_info.Chip) -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(device(chip))


def spec(shape: tuple[int, ...], dtype: Any, chip: str | tpu_info.Chip) -> jax.ShapeDtypeStruct:
    """An abstract array of ``shape`` and ``dtype`` placed on ``chip``."""
    return jax.ShapeDtypeStruct(tuple(shape), jax.numpy.dtype(dtype), sharding=sharding(chip))


def on_chip(tree: Any, chip: str | tpu_info.Chip) -> Any:
    """Every array-like leaf of ``tree`` (arrays, ``ShapeDtypeStruct``s) as a spec on
    ``chip``; other leaves (Python scalars, None) unchanged."""
    def put(x):
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return spec(x.shape, x.dtype, chip)
        return x
    return jax.tree.map(put, tree)
