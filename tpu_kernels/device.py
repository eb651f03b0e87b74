"""The ``tpu`` device: PrivateUse1 renamed, and a backend module at ``torch.tpu``.

After ``setup()``, ``torch.device("tpu")``, ``t.to("tpu")``, ``model.to("tpu")`` and
``torch.zeros(3, device="tpu")`` work as on any device. This runs before any other part
of the runtime is imported (the tensor layer names ``torch.device("tpu")``); the
factories' PrivateUse1 kernels are the dispatcher's (``dispatch/factories.py``).
"""
from __future__ import annotations

import functools
import os
import types
from typing import Callable

import jax
import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from tpu_kernels import random_state, streams


def _backend_module() -> types.ModuleType:
    m = types.ModuleType("torch.tpu")
    m.is_available = lambda: True
    m.is_initialized = lambda: True
    m._is_in_bad_fork = lambda: False
    m.device_count = lambda: 1
    m.current_device = lambda: 0
    m.set_device = lambda device: None
    m.synchronize = streams.synchronize
    m.manual_seed = random_state.manual_seed
    m.manual_seed_all = random_state.manual_seed
    m.seed = lambda: random_state.manual_seed(torch.initial_seed())
    m.seed_all = m.seed
    m.initial_seed = random_state.initial_seed
    m.get_rng_state = lambda device=None: torch.tensor(random_state.get_state(), dtype=torch.int64)
    m.set_rng_state = lambda state, device=None: random_state.set_state(tuple(state.tolist()))
    m.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    m.is_bf16_supported = lambda including_emulation=True: True
    m.jax_device = lambda: jax.local_devices()[0]   # this process's, under jax.distributed
    for name in ("Stream", "Event", "current_stream", "default_stream", "set_stream", "stream"):
        setattr(m, name, getattr(streams, name))
    return m


def _persistent_compile_cache() -> None:
    """Eager mode compiles one small executable per op signature; keep them across runs.

    ``TPU_KERNELS_JAX_CACHE`` names the directory (default ~/.cache/tpu_kernels/jax);
    ``0`` turns it off. A cache directory the user configured in JAX is left alone.
    """
    where = os.environ.get("TPU_KERNELS_JAX_CACHE", os.path.expanduser("~/.cache/tpu_kernels/jax"))
    if where == "0" or jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _keep_ties_when_moving_modules() -> None:
    """``model.to("tpu")`` must keep tied weights tied (GPT-2's embedding and LM head).

    A CPU parameter cannot take a tpu tensor's data in place, so torch would give each
    module that holds it a new Parameter and the tie would silently break. Moving a module
    to tpu therefore swaps parameters in place (torch's swap-on-conversion), for that
    call only: elsewhere torch's default stays as it is.
    """
    def moving(to: Callable) -> Callable:
        @functools.wraps(to)
        def wrapper(self, *args, **kwargs):
            device = torch._C._nn._parse_to(*args, **kwargs)[0]
            if device is None or device.type != "tpu" or torch.__future__.get_swap_module_params_on_conversion():
                return to(self, *args, **kwargs)
            torch.__future__.set_swap_module_params_on_conversion(True)
            try:
                return to(self, *args, **kwargs)
            finally:
                torch.__future__.set_swap_module_params_on_conversion(False)
        return wrapper

    torch.nn.Module.to = moving(torch.nn.Module.to)
    tpu = torch.nn.Module.tpu
    torch.nn.Module.tpu = lambda self, device=None: torch.nn.Module.to(self, torch.device("tpu", device or 0))
    torch.nn.Module.tpu.__doc__ = tpu.__doc__


_done = False


def setup() -> None:
    """Idempotent: register the ``tpu`` backend with torch."""
    global _done
    if _done:
        return
    _done = True
    jax.config.update("jax_enable_x64", True)  # torch's int64/float64 are real
    _persistent_compile_cache()
    _setup_privateuseone_for_python_backend("tpu", backend_module=_backend_module())
    _keep_ties_when_moving_modules()
