"""Files of the persistent caches (JAX's compile cache, the call cache): atomic writes and
least-recently-used pruning, shared by both so neither reads a half-written entry."""
from __future__ import annotations

import os
import tempfile
import time

STALE_TMP_S = 3600   # a temporary file this old belongs to a writer that died


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file, or the whole new one."""
    where = os.path.dirname(path)
    os.makedirs(where, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=where, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        remove(tmp)
        raise


def touch(path: str) -> None:
    """Mark an entry used (its modification time orders what pruning removes)."""
    try:
        os.utime(path)
    except OSError:
        pass


def remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def prune(where: str, suffix: str, limit_bytes: float) -> None:
    """When the entries (files ending in ``suffix``) pass ``limit_bytes``, remove the least
    recently used down to three quarters of it; remove temporary files of writers that died.
    One pass over the directory's own files; subdirectories are left alone."""
    now = time.time()
    entries = []
    try:
        with os.scandir(where) as it:
            for e in it:
                if not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat()
                if e.name.endswith(".tmp") and now - st.st_mtime > STALE_TMP_S:
                    remove(e.path)
                elif e.name.endswith(suffix):
                    entries.append((st.st_mtime, st.st_size, e.path))
    except OSError:
        return
    total = sum(size for _, size, _ in entries)
    if total <= limit_bytes:
        return
    for _, size, path in sorted(entries):   # oldest first
        if total <= limit_bytes * 0.75:
            break
        remove(path)
        total -= size
