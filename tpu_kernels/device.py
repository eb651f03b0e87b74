"""The ``tpu`` device: PrivateUse1 renamed, and a backend module at ``torch.tpu``.

After ``setup()``, ``torch.device("tpu")``, ``t.to("tpu")``, ``model.to("tpu")`` and
``torch.zeros(3, device="tpu")`` work as on any device, and ``torch.tpu`` answers what
``torch.cuda`` does: devices (``devices.py``), memory (``memory.py``), streams and events
(``streams.py``), random state (``random_state.py``). This runs before any other part
of the runtime is imported (the tensor layer names ``torch.device("tpu")``); the
factories' PrivateUse1 kernels are the dispatcher's (``dispatch/factories.py``).
"""
from __future__ import annotations

import functools
import itertools
import logging
import sys
import types
from typing import Any, Callable, NamedTuple

import jax
import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from tpu_kernels import code_memory, devices, errors, jax_cache, memory, random_state, streams, trace_ranges
from tpu_kernels.untraced import untraced

log = logging.getLogger(__name__)


def synchronize(device: Any = None) -> None:
    """Wait for every queued computation on the device (and raise deferred device errors)."""
    devices.synchronize(device)
    errors.raise_pending()


class DeviceProperties(NamedTuple):
    """``torch.tpu.get_device_properties``: what ``torch.cuda``'s answer has that a TPU has."""
    name: str
    platform: str
    total_memory: int
    index: int
    jax_id: int
    core_count: int

    def __repr__(self) -> str:
        return (f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
                f"total_memory={self.total_memory // 2**20}MB, index={self.index})")


def get_device_properties(device: Any = None) -> DeviceProperties:
    i = devices.index(device)
    d = devices.jax_devices()[i]
    return DeviceProperties(devices.name(i), d.platform, memory.mem_get_info(i)[1], i, d.id,
                            getattr(d, "num_cores", 1) or 1)


_MODULE_FUNCTIONS = {
    devices: ("device_count", "current_device", "set_device", "device", "device_of", "jax_device"),
    memory: ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
             "memory_stats", "memory_summary", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
             "mem_get_info", "empty_cache"),
    streams: ("Stream", "Event", "current_stream", "default_stream", "set_stream", "stream"),
}


def _backend_module() -> types.ModuleType:
    m = types.ModuleType("torch.tpu")
    m.__doc__ = "The tpu device's backend module (tpu_kernels): torch.cuda's API for TPUs."
    m.is_available = lambda: True
    m.is_initialized = lambda: True
    # what torch.cuda sets after its lazy init: torch.utils.checkpoint saves and restores
    # a device's RNG state only where it is set (without it a checkpointed dropout drew
    # another mask when recomputed in backward: wrong gradients, silently)
    m._initialized = True
    m.init = lambda: None
    m._is_in_bad_fork = lambda: False
    for module, names in _MODULE_FUNCTIONS.items():
        for name in names:
            setattr(m, name, getattr(module, name))
    m.synchronize = synchronize
    m.get_device_name = devices.name
    m.get_device_properties = get_device_properties
    m.get_device_capability = lambda device=None: (0, 0)
    m.reset_max_memory_allocated = memory.reset_peak_memory_stats
    m.manual_seed = random_state.manual_seed
    m.manual_seed_all = random_state.manual_seed
    m.seed = lambda: random_state.manual_seed(torch.initial_seed())
    m.seed_all = m.seed
    m.initial_seed = random_state.initial_seed
    m.get_rng_state = lambda device=None: torch.tensor(random_state.get_state(), dtype=torch.int64)
    m.set_rng_state = lambda state, device=None: random_state.set_state(tuple(state.tolist()))
    m.get_rng_state_all = lambda: [m.get_rng_state(i) for i in range(devices.device_count())]
    m.set_rng_state_all = lambda states: m.set_rng_state(states[0])
    m.get_amp_supported_dtype = lambda: [torch.bfloat16, torch.float16]
    m.is_bf16_supported = lambda including_emulation=True: True
    m.OutOfMemoryError = torch.OutOfMemoryError   # what a result that cannot fit raises, as on CUDA
    m.memory = submodule("torch.tpu.memory", memory, _MODULE_FUNCTIONS[memory])
    m.nvtx = submodule("torch.tpu.nvtx", trace_ranges,
                        ("range_push", "range_pop", "range_start", "range_end", "mark", "range"))
    return m


def submodule(name: str, source: types.ModuleType, names: tuple[str, ...]) -> types.ModuleType:
    """A module ``name`` holding ``source``'s ``names`` (and its docstring), importable by
    that name (``torch.tpu.memory.memory_allocated``, as ``torch.cuda.memory``'s)."""
    sub = types.ModuleType(name, source.__doc__)
    for n in names:
        setattr(sub, n, getattr(source, n))
    sys.modules[name] = sub
    return sub


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
    torch.nn.Module.tpu = lambda self, device=None: torch.nn.Module.to(
        self, torch.device("tpu", devices.current_device() if device is None else devices.index(device)))
    torch.nn.Module.tpu.__doc__ = tpu.__doc__


# called, without arguments, as each backward starts (``lazy.stage_boundary``: deferred
# mode runs the recorded forward while the backward is recorded; ``deferred_mode.install``)
BACKWARD_STARTS: list[Callable[[], None]] = []


def _backward_on_the_calling_thread() -> None:
    """``loss.backward()`` runs on the calling thread.

    torch's autograd engine gives each accelerator device a worker thread and a ready
    queue, as many as the device guard's ``deviceCount()``; the guard a Python backend
    registers (``torch._C._acc.DeviceGuard``) answers 1, so a node on ``tpu:1`` fails an
    INTERNAL ASSERT in engine.cpp. And the tpu ops are Python holding the GIL, so a worker
    thread gains nothing: handing each backward to it and back costs (the small GPT's
    training step, interleaved A/B: 24.7 -> 20.8 ms eager, 7.42 -> 6.95 ms compiled). So backward
    runs with the engine's multithreading off (``torch.autograd.set_multithreading_enabled
    (False)``, which AOTAutograd uses too): every node runs on the calling thread, in the
    engine's CPU queue. The engine's entry point is wrapped as torch's own
    ``torch.compiler`` wraps it.
    """
    run_backward = torch.autograd.graph._engine_run_backward

    @functools.wraps(run_backward)
    def wrapper(outputs, *args, **kwargs):
        if args:
            args = (_root_gradients(outputs, args[0]), *args[1:])
        if BACKWARD_STARTS:
            _backward_starts()
        if _compiled_autograd_on() and any(isinstance(o, torch.Tensor) and o.device.type == "tpu" for o in outputs):
            return _without_compiled_autograd(run_backward, outputs, *args, **kwargs)
        return _on_this_thread(run_backward, outputs, *args, **kwargs)

    torch.autograd.graph._engine_run_backward = wrapper
    torch.autograd._engine_run_backward = wrapper


def _on_this_thread(run_backward: Callable, outputs: Any, *args: Any, **kwargs: Any) -> Any:
    """The engine's backward with its multithreading off (see above)."""
    if not torch._C._is_multithreading_enabled():
        return run_backward(outputs, *args, **kwargs)
    with torch.autograd.set_multithreading_enabled(False):
        return run_backward(outputs, *args, **kwargs)


def _compiled_autograd_on() -> bool:
    """Whether a backward would be captured by compiled autograd
    (``torch._dynamo.config.compiled_autograd`` inside a compiled function)."""
    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    return ca is not None and ca.compiled_autograd_enabled


@untraced
def _without_compiled_autograd(run_backward: Callable, outputs: Any, *args: Any, **kwargs: Any) -> Any:
    """A backward over tpu tensors run by the engine itself where compiled autograd would
    capture it.

    Compiled autograd traces the engine's graph with fake copies of every tensor it
    meets, and cannot make them of tpu tensors (torch 2.13 stops inside its C++ capture).
    Such a backward runs as without it: its compiled parts are still the programs
    AOTAutograd made (said once in the log). CPU-only backwards keep it."""
    _say_compiled_autograd_ignored()
    with sys.modules["torch._dynamo.compiled_autograd"]._disable():
        return _on_this_thread(run_backward, outputs, *args, **kwargs)


@functools.cache   # once per process
def _say_compiled_autograd_ignored() -> None:
    log.warning(
        "torch._dynamo.config.compiled_autograd is on, but compiled autograd cannot capture a "
        "backward over tpu tensors: it runs as without it (the compiled forward's backward "
        "program still runs as one program; torch.tpu.graph captures a whole step)")


# The engine checks each gradient's device as it enters a node (validate_outputs), except
# where the node's input is a tensor subclass, as every tpu tensor is: a CPU gradient for a
# tpu tensor went on (``y.backward(torch.ones(3))`` left ``x.grad`` on the CPU, as did a
# custom Function's backward returning ``g.cpu()``). These two checks are CUDA's, in its
# words: a backward's starting gradients, and a Python Function's results; a 0-dim
# gradient moves to the device, as there. Only plain tensors are looked at (a tpu
# gradient is a subclass), so tpu gradients cost one type check each.
def _root_gradients(outputs: Any, grads: Any) -> Any:
    fixed = None
    for i, (o, g) in enumerate(zip(outputs, grads)):
        if type(g) is torch.Tensor and isinstance(o, torch.Tensor) and o.device.type == "tpu" and g.device != o.device:
            fixed = list(grads) if fixed is None else fixed
            fixed[i] = _moved(g, o.device, f"invalid gradient at index {i}")
    return grads if fixed is None else tuple(fixed)


def _moved(g: torch.Tensor, want: torch.device, what: str) -> torch.Tensor:
    """A CPU gradient ``g`` for a tensor on tpu ``want``: moved there when 0-dim, as CUDA
    moves it; else CUDA's error, ``what`` naming where it came from."""
    if g.dim() != 0:
        raise RuntimeError(f"{what} - expected device {want} but got {g.device}")
    return g.to(want)


def _function_gradients(node: Any, out: Any) -> Any:
    grads = out if isinstance(out, tuple) else (out,)
    if not any(type(g) is torch.Tensor for g in grads):
        return out
    # one result per forward input, one edge per tensor input (the index CUDA's message
    # gives): the inputs that need a gradient are, in order, the tensor inputs with an edge
    edges = iter([(j, e) for j, e in enumerate(node.next_functions) if e[0] is not None])
    fixed = None
    for i, need in enumerate(node.needs_input_grad):
        edge = next(edges, None) if need else None
        g = grads[i] if i < len(grads) else None
        if edge is None or type(g) is not torch.Tensor:
            continue
        j, (fn, nr) = edge
        want = fn._input_metadata[nr].device
        if want.type == "tpu" and g.device != want:
            fixed = list(grads) if fixed is None else fixed
            fixed[i] = _moved(g, want, f"Function {node.name()} returned an invalid gradient at index {j}")
    if fixed is None:
        return out
    return tuple(fixed) if isinstance(out, tuple) else fixed[0]


def _check_function_gradients() -> None:
    cls = torch.autograd.function.BackwardCFunction
    for name in ("apply", "apply_boxed"):
        def checked(self, *args, _apply=getattr(cls, name)):
            return _function_gradients(self, _apply(self, *args))
        checked.__doc__ = getattr(cls, name).__doc__
        setattr(cls, name, checked)


@untraced
def _backward_starts() -> None:
    """Run the ``BACKWARD_STARTS`` hooks. Untraced: a backward started from compiled code's
    eager stretch (``torch.autograd.grad`` inside a compiled function) runs this frame
    under Dynamo's frame hook, and a hook (deferred mode's flush) runs JAX."""
    for hook in BACKWARD_STARTS:
        hook()


class _DeviceGuard(torch._C._acc.DeviceGuard):
    """The device guard torch's C++ side asks for the device type: about 500 times in a
    small GPT's training step. A builtin answers it (torch's default guard is a Python
    method: a frame per call; 0.15 ms a step, A/B in one process)."""
    type_ = staticmethod(itertools.repeat(torch._C._autograd.DeviceType.PrivateUse1).__next__)


_done = False


def setup() -> None:
    """Idempotent: register the ``tpu`` backend with torch."""
    global _done
    if _done:
        return
    _done = True
    jax.config.update("jax_enable_x64", True)  # torch's int64/float64 are real
    jax_cache.install()
    code_memory.install()   # XLA crashes past the kernel's limit on mapped code
    _setup_privateuseone_for_python_backend("tpu", backend_module=_backend_module(), device_guard=_DeviceGuard())
    _keep_ties_when_moving_modules()
    _backward_on_the_calling_thread()
    _check_function_gradients()
    random_state.install_generator()
