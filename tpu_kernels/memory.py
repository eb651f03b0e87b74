"""``torch.tpu``'s memory API: what tpu tensors hold, and what the device has.

JAX's ``device.memory_stats()`` answers where the backend keeps them (TPU: bytes in use,
peak, limit). Elsewhere (the CPU backend has none) the runtime's own accounting answers:
every tpu ``Storage`` adds its bytes when it is made and takes them off when it is freed
(``allocate``/``free``, called by ``storage.py``). ``empty_cache`` runs the hooks that the
layers above register (executable and view caches): cached programs hold no tensor memory
of their own, but their constants and compiled code are what a user asks to free.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable

import jax
import numpy as np

from tpu_kernels import devices

_lock = threading.Lock()
_MAX = 64                               # device indices with counters (local devices)
_current = [0] * _MAX                   # bytes held by live tpu storages, per device
_peak = [0] * _MAX
_allocs = [0] * _MAX                    # storages made / freed since the start (or a reset)
_frees = [0] * _MAX
_allocated_total = [0] * _MAX
_freed_total = [0] * _MAX
_jax_peak_reset = [False] * _MAX        # after reset_peak_memory_stats our own peak answers
_empty_cache_hooks: list[Callable[[], None]] = []


def nbytes(array: Any) -> int:
    """Bytes of a jax array, a deferred placeholder or a shape/dtype spec."""
    n = getattr(array, "nbytes", None)
    return n if n is not None else int(array.size) * np.dtype(array.dtype).itemsize


def allocate(index: int, array: Any, n: int | None = None) -> int:
    """Count a new storage of ``array`` (``n`` bytes, computed when None) on device
    ``index``; its byte count (for ``free``)."""
    if n is None:
        n = nbytes(array)
    with _lock:
        c = _current[index] = _current[index] + n
        if c > _peak[index]:
            _peak[index] = c
        _allocs[index] += 1
        _allocated_total[index] += n
    return n


def free(index: int, n: int) -> None:
    with _lock:
        _current[index] -= n
        _frees[index] += 1
        _freed_total[index] += n


def on_empty_cache(hook: Callable[[], None]) -> None:
    """Run ``hook`` on ``torch.tpu.empty_cache()`` (layers above register their caches)."""
    _empty_cache_hooks.append(hook)


def empty_cache() -> None:
    """Drop cached executables and view programs (``torch.cuda.empty_cache``'s counterpart):
    the runtime's caches, then JAX's own (``jax.clear_caches``), which hold executables
    that none of ours do (an operation JAX applies outside any jit keeps one). After three
    transformers models a process had 3,096 memory mappings with ours emptied, 1,021 with
    both (540 at its start); after sixteen, 15,877 with ours emptied."""
    for hook in _empty_cache_hooks:
        hook()
    jax.clear_caches()


def _jax_stats(device: Any) -> dict[str, int]:
    return devices.jax_device(device).memory_stats() or {}


def memory_allocated(device: Any = None) -> int:
    """Bytes held by tpu tensors on ``device``."""
    stats = _jax_stats(device)
    return stats.get("bytes_in_use", _current[devices.index(device)])


def max_memory_allocated(device: Any = None) -> int:
    """The peak of ``memory_allocated`` since the start or ``reset_peak_memory_stats``."""
    i = devices.index(device)
    stats = _jax_stats(device)
    if "peak_bytes_in_use" in stats and not _jax_peak_reset[i]:
        return stats["peak_bytes_in_use"]
    return _peak[i]


def memory_reserved(device: Any = None) -> int:
    """Bytes the device's allocator holds (JAX's reservation where it reports one)."""
    stats = _jax_stats(device)
    return stats.get("bytes_reserved", stats.get("bytes_in_use", _current[devices.index(device)]))


def max_memory_reserved(device: Any = None) -> int:
    stats = _jax_stats(device)
    return stats.get("peak_bytes_reserved", max_memory_allocated(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    i = devices.index(device)
    with _lock:
        _peak[i] = _current[i]
        _jax_peak_reset[i] = True


def reset_accumulated_memory_stats(device: Any = None) -> None:
    i = devices.index(device)
    with _lock:
        _allocs[i] = _frees[i] = _allocated_total[i] = _freed_total[i] = 0


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device: JAX's limit where it has one, else the host's RAM."""
    stats = _jax_stats(device)
    if "bytes_limit" in stats:
        total = stats["bytes_limit"]
        return total - stats.get("bytes_in_use", 0), total
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def memory_stats(device: Any = None) -> dict[str, int]:
    """torch.cuda's flat keys (``allocated_bytes.all.current`` ...), plus JAX's own under
    ``jax.*`` where it reports them."""
    i = devices.index(device)
    alloc, peak, reserved = memory_allocated(device), max_memory_allocated(device), memory_reserved(device)
    out = {
        "allocated_bytes.all.current": alloc, "allocated_bytes.all.peak": peak,
        "allocated_bytes.all.allocated": _allocated_total[i], "allocated_bytes.all.freed": _freed_total[i],
        "active_bytes.all.current": alloc, "active_bytes.all.peak": peak,
        "reserved_bytes.all.current": reserved, "reserved_bytes.all.peak": max_memory_reserved(device),
        "allocation.all.current": _allocs[i] - _frees[i], "allocation.all.allocated": _allocs[i],
        "allocation.all.freed": _frees[i], "num_alloc_retries": 0, "num_ooms": 0,
    }
    out.update({f"jax.{k}": v for k, v in _jax_stats(device).items()})
    return out


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A short text table of ``memory_stats``."""
    stats = memory_stats(device)
    rows = [f"{k:<40} {v:>16,}" for k, v in stats.items()]
    return f"tpu:{devices.index(device)} memory ({devices.name(device)})\n" + "\n".join(rows)
