"""The tpu device's random generator: a seed and a counter, folded into a JAX key per op.

Each random op gets ``fold_in(key(seed), counter)`` with a fresh counter, passed to the
jitted op as data so a new draw never retraces. ``torch.manual_seed`` resets both.
"""
from __future__ import annotations

import threading

import jax
import numpy as np

_lock = threading.Lock()
_seed = 0
_counter = 0


def manual_seed(seed: int) -> None:
    global _seed, _counter
    with _lock:
        _seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
        _counter = 0


def initial_seed() -> int:
    return _seed


def get_state() -> tuple[int, int]:
    return _seed, _counter


def set_state(state: tuple[int, int]) -> None:
    global _seed, _counter
    with _lock:
        _seed, _counter = int(state[0]), int(state[1])


def reserve(n: int) -> np.ndarray:
    """Take ``n`` counters at once: (seed low, seed high, counter) as uint32, the key data
    of the first (the dynamic input of one random op); the others follow it."""
    global _counter
    with _lock:  # seed and counter read together: a concurrent manual_seed never mixes them
        c, seed = _counter + 1, _seed
        _counter += n
    return np.array([seed & 0xFFFF_FFFF, seed >> 32, c & 0xFFFF_FFFF], dtype=np.uint32)


def key_from_data(data: jax.Array) -> jax.Array:
    key = jax.random.key(data[0])
    return jax.random.fold_in(jax.random.fold_in(key, data[1]), data[2])
