"""A bounded, thread-safe LRU map with hit statistics: the dispatcher's executable caches.

Each entry of the op cache holds a compiled XLA executable; an eager program with many
shapes would otherwise grow it without end. ``TPU_KERNELS_CACHE_SIZE`` sets the bound.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import threading
from typing import Any

DEFAULT_SIZE = int(os.environ.get("TPU_KERNELS_CACHE_SIZE", "8192"))


@dataclasses.dataclass
class CacheInfo:
    hits: int
    misses: int
    evictions: int
    size: int
    maxsize: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class LRU:
    def __init__(self, maxsize: int = DEFAULT_SIZE, on_evict: Any = None) -> None:
        self.maxsize = maxsize
        self.on_evict = on_evict  # called with (key, value) for each evicted entry
        self._data: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def get(self, key: Any) -> Any:
        """The value, marked as recently used; None (a miss) when absent."""
        try:
            value = self._data[key]
        except KeyError:
            self.misses += 1
            return None
        self.hits += 1
        try:
            self._data.move_to_end(key)
        except KeyError:  # evicted by another thread in between
            pass
        return value

    def touch(self, key: Any) -> None:
        """Mark ``key`` recently used (a hit found through another index)."""
        try:
            self._data.move_to_end(key)
        except KeyError:  # evicted meanwhile
            pass

    def put(self, key: Any, value: Any) -> Any:
        with self._lock:
            self._data[key] = value
            while len(self._data) > self.maxsize:
                old = self._data.popitem(last=False)
                self.evictions += 1
                if self.on_evict is not None:
                    self.on_evict(*old)
        return value

    def values(self) -> list:
        with self._lock:
            return list(self._data.values())

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def info(self) -> CacheInfo:
        return CacheInfo(self.hits, self.misses, self.evictions, len(self._data), self.maxsize)
