"""JAX's persistent compile cache as eager mode uses it: one small executable per op
signature, kept across runs.

``TPU_KERNELS_JAX_CACHE`` names the directory (default ``~/.cache/tpu_kernels/jax``; ``0``:
off); ``TPU_KERNELS_JAX_CACHE_MB`` bounds it (default 4096). A cache directory or size the
user configured in JAX is left to JAX.

JAX's own file cache is replaced by ``FileCache`` because of its two modes: unbounded, it
writes entries in place, so a process can read an entry another is still writing (XLA
aborts deserializing the truncated executable); bounded, every write lists and stats the
whole directory under a file lock, so a run that compiles n programs does n² work (a cold
test suite went from 18 to 89 minutes). ``FileCache`` writes atomically (no lock needed)
and prunes least recently used entries at most once an hour per directory.
"""
from __future__ import annotations

import logging
import os
import pathlib
import time

import jax
from jax._src import compilation_cache
from jax._src.compilation_cache_interface import CacheInterface

from tpu_kernels import cache_files

log = logging.getLogger("tpu_kernels.jax_cache")
_SUFFIX = "-cache"           # JAX's name for an entry file, kept so either cache reads both
_STAMP = ".tpu_kernels_pruned"
PRUNE_EVERY_S = 3600
LIMIT_MB = 4096


class FileCache(CacheInterface):
    """A directory of compiled executables: atomic writes, lock-free reads, pruned LRU."""

    def __init__(self, path: str, limit_bytes: float) -> None:
        self._path = pathlib.Path(path)
        self._limit = limit_bytes
        self._checked = False
        self._path.mkdir(parents=True, exist_ok=True)

    def _file(self, key: str) -> str:
        if not key:
            raise ValueError("key cannot be empty")
        return os.path.join(self._path, key + _SUFFIX)

    def get(self, key: str) -> bytes | None:
        path = self._file(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        cache_files.touch(path)
        return data

    def put(self, key: str, value: bytes) -> None:
        path = self._file(key)
        if os.path.exists(path):
            return
        cache_files.write_atomic(path, value)
        if not self._checked:
            self._checked = True
            self._prune_if_due()

    def _prune_if_due(self) -> None:
        stamp = os.path.join(self._path, _STAMP)
        try:
            if time.time() - os.path.getmtime(stamp) < PRUNE_EVERY_S:
                return
        except OSError:
            pass
        pathlib.Path(stamp).touch()
        cache_files.prune(str(self._path), _SUFFIX, self._limit)


def install() -> None:
    """Point JAX's persistent compile cache at our directory, with ``FileCache`` as its store."""
    where = os.environ.get("TPU_KERNELS_JAX_CACHE", os.path.expanduser("~/.cache/tpu_kernels/jax"))
    if where == "0" or jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    limit = float(os.environ.get("TPU_KERNELS_JAX_CACHE_MB", LIMIT_MB)) * 2**20
    jax_file_cache = compilation_cache.get_file_cache

    def file_cache(path: str):
        if path != where or "://" in path or jax.config.jax_compilation_cache_max_size != -1:
            return jax_file_cache(path)   # another directory, or a bound the user set: JAX's
        return FileCache(path, limit), path

    compilation_cache.get_file_cache = file_cache
