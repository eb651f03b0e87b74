"""The tpu device's random generator: a seed and a counter, folded into a JAX key per op.

Each random op gets ``fold_in(key(seed), counter)`` with a fresh counter, passed to the
jitted op as data so a new draw never retraces. ``torch.manual_seed`` resets both.
``torch.Generator(device="tpu")`` makes a ``TpuGenerator``: its own seed and counter, used
by the random ops it is passed to (``torch.randn(..., generator=g)``).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import jax
import numpy as np
import torch

_lock = threading.Lock()
_seed = 0
_counter = 0
# while a graph is captured (``graphs.py``): the key arrays handed out, with their counters'
# offsets from the capture's start, so each replay draws fresh counters at those offsets
_captured: list[tuple[np.ndarray, int]] | None = None
_capture_start = 0


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


def reserve(n: int, generator: "TpuGenerator | None" = None) -> np.ndarray:
    """Take ``n`` counters at once: (seed low, seed high, counter) as uint32, the key data
    of the first (the dynamic input of one random op); the others follow it. From
    ``generator`` when the op was given a tpu generator, else the device's."""
    if generator is not None:   # a key drawn from the op's generator (its counters follow)
        if _captured is not None:
            raise RuntimeError("a random op given a generator= was captured in a tpu graph: a "
                               "captured graph draws from the device's generator only (drop the "
                               "generator argument inside the capture)")
        bits = int(torch.randint(-2**63, 2**63 - 1, (), dtype=torch.int64, generator=generator)) & (2**64 - 1)
        return _key_data(bits, 1)
    seed, c = take(n)
    key = _key_data(seed, c)
    if _captured is not None:
        _captured.append((key, c - _capture_start))
    return key


def take(n: int) -> tuple[int, int]:
    """Take ``n`` counters of the device's generator: (its seed, the first counter)."""
    global _counter
    with _lock:  # seed and counter read together: a concurrent manual_seed never mixes them
        c, seed = _counter + 1, _seed
        _counter += n
    return seed, c


def next_key_data() -> np.ndarray:
    """The key data the device generator's next draw (``reserve(1)``) will hand out."""
    with _lock:
        return _key_data(_seed, _counter + 1)


@contextlib.contextmanager
def replaying(key_data: Any) -> Iterator[None]:
    """The device generator's next draw hands out ``key_data`` (as ``next_key_data`` gave
    it) and those after it follow; the generator's state is restored on exit."""
    low, high, counter = (int(b) for b in np.asarray(key_data))
    saved = get_state()
    set_state((low | high << 32, counter - 1))
    try:
        yield
    finally:
        set_state(saved)


def key_data(seed: int, counters: np.ndarray) -> np.ndarray:
    """Key data (one row per counter) as ``reserve`` hands it out."""
    rows = np.empty((len(counters), 3), np.uint32)
    rows[:, 0], rows[:, 1], rows[:, 2] = seed & 0xFFFF_FFFF, seed >> 32, counters & 0xFFFF_FFFF
    return rows


def begin_capture() -> None:
    """Note the keys ``reserve`` hands out until ``end_capture``."""
    global _captured, _capture_start
    _captured, _capture_start = [], _counter + 1


def end_capture() -> tuple[list[tuple[np.ndarray, int]], int]:
    """The captured keys (array, counter offset) and how many counters the capture took."""
    global _captured
    keys, _captured = _captured or [], None
    return keys, _counter + 1 - _capture_start


def _key_data(seed: int, c: int) -> np.ndarray:
    return np.array([seed & 0xFFFF_FFFF, seed >> 32, c & 0xFFFF_FFFF], dtype=np.uint32)


class TpuGenerator(torch._C.Generator):
    """``torch.Generator(device="tpu")``. Its state is torch's own CPU generator state (so
    ``manual_seed``, ``get_state``/``set_state``, ``initial_seed`` behave as torch's): each
    random op it is given draws 64 bits from it as its JAX key (see ``reserve``). torch
    hands ops a plain ``torch.Generator`` over the same state, which is all ``reserve`` needs."""

    def __new__(cls, device: Any = "tpu") -> "TpuGenerator":
        return super().__new__(cls, "cpu")

    def __init__(self, device: Any = "tpu") -> None:
        d = torch.device(device)
        self._device = torch.device("tpu", 0 if d.index is None else d.index)

    @property
    def device(self) -> torch.device:
        return self._device

    def __repr__(self) -> str:
        return f"<torch.Generator device={self._device}>"


class _GeneratorType(type(torch._C.Generator)):
    """``torch.Generator``'s type: makes a ``TpuGenerator`` for a tpu device, torch's own
    generator for any other; every generator is still an instance of ``torch.Generator``."""

    def __call__(cls, device: Any = "cpu") -> torch._C.Generator:
        if torch.device(device).type == "tpu":
            return TpuGenerator(device)
        return torch._C.Generator(device)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, torch._C.Generator)


class Generator(torch._C.Generator, metaclass=_GeneratorType):
    __doc__ = torch._C.Generator.__doc__


def install_generator() -> None:
    """``torch.Generator(device="tpu")`` works (torch's C++ asks the backend for a
    generator, which a Python backend cannot register)."""
    if torch.Generator is torch._C.Generator:
        torch.Generator = Generator


def key_from_data(data: jax.Array) -> jax.Array:
    key = jax.random.key(data[0])
    return jax.random.fold_in(jax.random.fold_in(key, data[1]), data[2])
