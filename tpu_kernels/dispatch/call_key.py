"""The key of a call signature in the persistent call cache (``call_cache.py``).

Everything that decides what a call signature's program is goes into the key's text: the
op, the impl the route chose (a function of this package), the call's template and leaf
geometry, the settings read while tracing (``_settings``), the ``TPU_KERNELS_*``/``JAX_*``/``XLA_*``
environment, the jax/jaxlib/torch/numpy/Python versions, the platform and its version,
and this package's files (path, size, modification time: an edited source file makes a
new key). A call whose key cannot be written exactly (an argument of an unknown type, a
tensor in a non-tensor slot, an impl from outside the package) has none: it is not kept.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from typing import Any

import jax
import numpy as np
import torch

from tpu_kernels.dispatch.cache import _default_dtype, _matmul_precision
from tpu_kernels.dispatch.plan import SLOT, OpPlan
from tpu_kernels.dispatch.signature import split
from tpu_kernels.pallas.tpu_info import pinned
from tpu_kernels.registry import REGISTRY, Impl
from tpu_kernels.registry.context import INDEX_CHECKS

FORMAT = "tpu_kernels-call-cache/1"
_ENV_PREFIXES = ("TPU_KERNELS_", "JAX_", "XLA_", "LIBTPU_")
_ENV_IGNORED = ("TPU_KERNELS_JAX_CACHE", "TPU_KERNELS_CALL_CACHE")
_PACKAGES = ("tpu_kernels", "tpu_kernels.registry", "tpu_kernels.pallas", "tpu_kernels.helion_kernels")


class Unkeyable(Exception):
    """The call cannot be keyed exactly: it is not kept."""


def key_text(op: Any, route_kind: str, impl: Impl, plan: OpPlan, args: tuple, kwargs: dict,
             targs: tuple, tkw: tuple) -> str | None:
    """The call's key, or None when it has none (see the module docstring)."""
    module = getattr(impl.fn, "__module__", None) or ""
    if not module.startswith("tpu_kernels."):
        return None   # a user's impl: its code is not in the fingerprint
    for static in ((), impl.static) if impl.static else ((),):   # the split the dispatcher keyed on
        sp, t2, k2 = split(plan, args, kwargs, static)
        if (t2, k2) == (targs, tkw):
            break
    else:
        return None
    if _tensors((args, kwargs)) != sum(isinstance(v, torch.Tensor) for v in sp.leaves):
        return None   # a tensor in a non-tensor slot: the template names it by identity
    try:
        parts = [FORMAT, _fixed(), _env(), _settings(),
                 str(op), route_kind, impl.kind, impl.name, f"{module}.{impl.fn.__qualname__}",
                 _encode(targs), _encode(tkw), _encode(tuple(sp.sig))]
    except Unkeyable:
        return None
    return "\n".join(parts)


def _settings() -> str:
    """What the dispatcher and the kernels read while tracing, besides the environment:
    the matmul precision, the default dtype, the index checks, the registry's disabled kinds and interpret
    switch, the chip ``compile_for`` names, the tuned block tables' switch."""
    switches = REGISTRY.switches()
    chip = pinned()
    tuned = sys.modules.get("tpu_kernels.pallas.tuned")   # not imported: nothing turned it off
    return repr((_matmul_precision(), _default_dtype(), INDEX_CHECKS.on, sorted(switches[1]), switches[2],
                 None if chip is None else chip.name, tuned is not None and tuned._OFF.get()))


def _tensors(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return 1
    if isinstance(x, dict):
        return sum(_tensors(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_tensors(v) for v in x)
    return 0


_ATOMS = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format,
          np.dtype)


def _encode(v: Any) -> str:
    """An exact text for a template value; ``Unkeyable`` for any value it cannot name."""
    if v is SLOT:
        return "<slot>"
    t = type(v)
    if t in (tuple, list, torch.Size):
        return f"{t.__name__}(" + ",".join(_encode(x) for x in v) + ")"
    if t in _ATOMS or isinstance(v, np.dtype):
        return f"{t.__name__}:{v!r}"
    if t is type and v in (int, float, bool, complex):   # a number leaf's type
        return f"type:{v.__name__}"
    raise Unkeyable(t)


_ENV_SEEN: list = [None, ""]   # the environment last read, and its part of the key


def _env() -> str:
    """The key's environment part, read again whenever the environment changed."""
    data = getattr(os.environ, "_data", None)   # CPython's raw mapping: compared at C speed
    snap = tuple(data.items()) if isinstance(data, dict) else None
    if snap is None or snap != _ENV_SEEN[0]:
        text = repr(sorted((k, v) for k, v in os.environ.items()
                           if k.startswith(_ENV_PREFIXES) and k not in _ENV_IGNORED))
        _ENV_SEEN[:] = [snap, text]
    return _ENV_SEEN[1]


@functools.lru_cache(maxsize=1)
def _fixed() -> str:
    """What stays the same for the process: versions, platform, config, package files."""
    dev = jax.devices()[0]
    import jaxlib
    return repr((sys.version, torch.__version__, jax.__version__, jaxlib.__version__, np.__version__,
                 dev.platform, dev.device_kind, dev.client.platform_version, jax.device_count(),
                 jax.config.jax_enable_x64, str(jax.config.jax_default_matmul_precision),
                 str(jax.config.jax_default_prng_impl), _fingerprint()))


def _fingerprint() -> str:
    """A hash of every file of the package's source trees: path, size, modification time."""
    h = hashlib.sha256()
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        for root in (spec.submodule_search_locations or []) if spec is not None else []:
            for d, dirs, files in os.walk(root):
                dirs[:] = sorted(x for x in dirs if x != "__pycache__")
                for f in sorted(files):
                    p = os.path.join(d, f)
                    try:
                        st = os.stat(p)
                    except OSError:
                        continue
                    h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()
