"""A persistent cache of call signatures: a warm process's first call of a signature skips
torch's meta function, the impl's trace, the lowering and XLA's compile.

JAX's persistent compilation cache skips only XLA's compile: every new process still
traces and lowers each signature's program (most of a first forward's time once the
executables are cached). This cache keeps, per call signature (``call_key.py``), the
compiled executable (``jax.experimental.serialize_executable``), what each check flag
means, and torch's result metadata. A signature's first call in a process compiles as
before, then stores its entry; a later process with the same key loads it instead.

Where: ``tpu_kernels_calls/`` in JAX's persistent cache directory (``device.py``: by
default ``~/.cache/tpu_kernels/jax``); off without that directory, with several tpu
devices (an executable is bound to its device), or with ``TPU_KERNELS_CALL_CACHE=0``.
An entry holds a checksum and its full key: a damaged, foreign or unreadable entry is
ignored (and rebuilt), never trusted. A call traced into a bigger program (deferred
mode, a compiled graph) runs the ordinary jitted function.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import logging
import os
import pickle
import threading
from typing import Any, Callable

import jax
import torch
from jax._src import config as jax_config   # the thread-local form of a config setting
from jax.experimental import serialize_executable

from tpu_kernels import cache_files, devices
from tpu_kernels.registry.context import OutMeta

log = logging.getLogger("tpu_kernels.dispatch")
_MAGIC = b"tpu_kernels-call/1\n"
SUBDIR = "tpu_kernels_calls"


def directory() -> str | None:
    """The cache's directory, or None when the cache is off."""
    if os.environ.get("TPU_KERNELS_CALL_CACHE", "1") in ("0", ""):
        return None
    root = jax.config.jax_compilation_cache_dir
    if not root or "://" in root or not jax.config.jax_enable_compilation_cache or devices.several:
        return None
    return os.path.join(root, SUBDIR)


class Entry:
    """One signature's place in the cache: ``load`` what a process stored, ``runner`` the
    function the signature runs (storing its executable at its first call)."""

    def __init__(self, where: str, key: str) -> None:
        self.key = key
        self.path = os.path.join(where, hashlib.sha256(key.encode()).hexdigest()[:40] + ".call")

    def load(self) -> dict | None:
        """The stored entry (its executable loaded), or None: missing, damaged or foreign."""
        try:
            with open(self.path, "rb") as f:
                blob = f.read()
        except OSError:
            return None
        try:
            head, digest, payload = blob[:len(_MAGIC)], blob[len(_MAGIC):len(_MAGIC) + 32], blob[len(_MAGIC) + 32:]
            if head != _MAGIC or hashlib.sha256(payload).digest() != digest:
                raise ValueError("bad header or checksum")
            got = pickle.loads(payload)
            if got["key"] != self.key:
                raise ValueError("another key")
            cache_files.touch(self.path)
            _handlers_registered()
            return {"exe": serialize_executable.deserialize_and_load(*got["exe"]),
                    "checks": [(_exception(m, q), msg) for m, q, msg in got["checks"]],
                    "result_meta": _decode(got["result"]),
                    "func_outs": [None if o is None else OutMeta(tuple(o[0]), _dtype(o[1])) for o in got["func_outs"]]}
        except Exception as exc:  # noqa: BLE001 - any damage: compile as if there were no entry
            log.warning("tpu_kernels call cache: ignoring unreadable entry %s (%s: %s)",
                        self.path, type(exc).__name__, exc)
            return None

    def store(self, exe: Any, checks: list, result_meta: Any, func_outs: list) -> None:
        """Write the entry (atomically); a call that cannot be stored is only not kept."""
        try:
            entry = {"key": self.key, "exe": serialize_executable.serialize(exe),
                     "checks": [(e.__module__, e.__qualname__, msg) for e, msg in checks],
                     "result": _encode(result_meta),
                     "func_outs": [None if o is None else (o.shape, str(o.dtype)) for o in func_outs]}
            for e, _ in checks:
                if _exception(e.__module__, e.__qualname__) is not e:
                    raise ValueError(f"exception {e} cannot be found again by name")
            payload = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
            cache_files.write_atomic(self.path, _MAGIC + hashlib.sha256(payload).digest() + payload)
            _prune_once(os.path.dirname(self.path))
        except Exception as exc:  # noqa: BLE001 - not kept: the next process compiles again
            log.debug("tpu_kernels call cache: not storing %s (%s: %s)", self.path, type(exc).__name__, exc)

    def runner(self, jitted: Callable, loaded: dict | None, result_meta: Any, func_outs: list,
               settled: Any = None) -> Callable:
        """What the signature runs: its executable (the loaded one, or compiled and stored at
        the first call) for arrays; ``jitted`` for traced arguments. Carries ``.checks``.
        Once it has settled on what it calls for arrays, that is ``settled.call`` too
        (the hot path calls it without this function's frame)."""
        def first(*dyn: Any) -> Any:
            if _traced(dyn):
                return jitted(*dyn)
            if loaded is None:
                try:
                    exe, fresh = _compile_fresh(jitted, dyn)
                except Exception:  # noqa: BLE001 - the jitted call raises it again, as before
                    settle(jitted)
                    return jitted(*dyn)
                if fresh:
                    self.store(exe, jitted.checks, result_meta, func_outs)
                out = exe(*dyn)
            else:
                exe = loaded["exe"]
                try:
                    out = exe(*dyn)
                except TypeError:
                    raise
                except Exception as exc:  # noqa: BLE001 - as if there were no entry: the
                    log.warning("tpu_kernels call cache: dropping entry %s, its executable "
                                "failed (%s: %s)", self.path, type(exc).__name__, exc)
                    cache_files.remove(self.path)   # jitted call raises a genuine error again
                    settle(jitted)
                    return jitted(*dyn)
            # from now on the executable's C++ call, without ``Compiled.__call__``'s frame
            settle(getattr(exe, "_call", None) or exe)
            return out

        def settle(fn: Callable) -> None:
            state[0] = fn
            if settled is not None:
                settled.call = fn

        state: list[Callable] = [first]

        def run(*dyn: Any) -> Any:
            try:
                return state[0](*dyn)
            except TypeError:   # tracers, or arrays of another weak type: jit's own paths
                return jitted(*dyn)

        run.checks = jitted.checks
        return run


# XLA:CPU loses an executable's code when one read back from a serialization is serialized
# again (running it fails: "Function ... not found"), so what this cache stores is always
# freshly compiled. The first compile is the plain one (a miss in JAX's persistent cache
# compiles and writes there as before); when it was read back from JAX's cache instead, a
# second compile under a compile option of its own (its own JAX cache key, never written
# there) gives the executable to store.
_FRESH = {"xla_embed_ir_in_executable": False}   # XLA's default: changes only the key
_LOCAL = threading.local()


def _on_event(event: str, **kwargs: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits" and getattr(_LOCAL, "hits", None) is not None:
        _LOCAL.hits += 1


jax.monitoring.register_event_listener(_on_event)


def _compile_fresh(jitted: Callable, dyn: tuple) -> tuple[Any, bool]:
    """(the signature's executable, whether it can be stored: compiled here, not read back)."""
    _LOCAL.hits = 0
    try:
        lowered = jitted.lower(*dyn)
        exe = lowered.compile()
        if _LOCAL.hits == 0:
            return exe, True
        _LOCAL.hits = 0
        with _no_jax_cache_write():
            fresh = lowered.compile(compiler_options=_FRESH)
        return (fresh, True) if _LOCAL.hits == 0 else (exe, False)
    finally:
        _LOCAL.hits = None


def _no_jax_cache_write():
    """JAX writes an executable to its cache when it took at least this long to compile."""
    state = getattr(jax_config, "persistent_cache_min_compile_time_secs", None)
    return state(float("inf")) if callable(state) else contextlib.nullcontext()


LIMIT_MB = 1024   # TPU_KERNELS_CALL_CACHE_MB: above this, the least recently used go
_pruned: list[str] = []


def _prune_once(where: str) -> None:
    """Once per process (at its first store): prune to ``TPU_KERNELS_CALL_CACHE_MB``."""
    if where in _pruned:
        return
    _pruned.append(where)
    cache_files.prune(where, ".call", float(os.environ.get("TPU_KERNELS_CALL_CACHE_MB", LIMIT_MB)) * 2**20)


@functools.cache
def _handlers_registered() -> None:
    """Register XLA:CPU's LAPACK custom-call handlers before a stored executable loads.
    JAX registers them when it first lowers a linalg op; an executable read back from this
    cache (cholesky, solve, svd, eigh, ...) in a process that has lowered none called a
    handler that was not there and crashed the process (SIGSEGV). jax.export does the same
    before it runs a deserialized CPU program."""
    if jax.default_backend() == "cpu":
        from jax._src.lax import linalg   # private: JAX has no public hook for this
        linalg.initialize_lapack()


def _traced(dyn: tuple) -> bool:
    return any(isinstance(d, jax.core.Tracer) for d in dyn)


def _exception(module: str, qualname: str) -> type:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise TypeError(f"{module}.{qualname} is not an exception")
    return obj


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."))
    if not isinstance(dt, torch.dtype):
        raise TypeError(f"{name} is not a torch dtype")
    return dt


def _encode(meta: Any) -> Any:
    """torch's meta result as plain data (tensors: sizes, strides, dtype)."""
    if isinstance(meta, torch.Tensor):
        if meta.storage_offset() != 0:
            raise ValueError("a result with a storage offset")
        return ("tensor", tuple(meta.shape), tuple(meta.stride()), str(meta.dtype))
    if isinstance(meta, (list, tuple)):
        return ("list" if isinstance(meta, list) else "tuple", [_encode(m) for m in meta])
    if meta is None or type(meta) in (bool, int, float):
        return ("value", meta)
    raise ValueError(f"a result of type {type(meta).__name__}")


def _decode(data: Any) -> Any:
    kind, *rest = data
    if kind == "tensor":
        shape, stride, dtype = rest
        return torch.empty_strided(shape, stride, dtype=_dtype(dtype), device="meta")
    if kind in ("list", "tuple"):
        items = [_decode(d) for d in rest[0]]
        return items if kind == "list" else tuple(items)
    if kind == "value":
        return rest[0]
    raise ValueError(f"unknown entry part {kind!r}")
