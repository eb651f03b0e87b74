"""Running a recording (``lazy.py``): its arguments packed, its functions replayed inside
one jit trace, on its device."""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax._src.lax import lax as jax_lax   # _convert_element_type: the one way to a weak type

from tpu_kernels import devices


def run_on(index: int, run: Callable, inputs: list) -> list:
    """``run(*inputs)`` on tpu ``index``: its uncommitted inputs (host scalars' copies)
    and an input-free program go there too, and its results stay there."""
    if index == 0:
        return run(*inputs)
    dev = devices.jax_devices()[index]
    with jax.default_device(dev):
        return jax.device_put(run(*inputs), dev)


# Python numbers a recording takes (an optimizer's per-parameter step sizes) go into the
# program as one host array per type, not one argument each: a jit call pays a few µs per
# argument (the small GPT's AdamW step has 63 of them)
PACKED = {float: np.float64, int: np.int64, bool: np.bool_}


def packed(inputs: list, avals: list) -> list:
    """The program's arguments: the inputs that are not Python numbers, in order, then one
    array per type in ``PACKED`` that has numbers among the inputs."""
    direct, packs = [], {}
    for v, a in zip(inputs, avals):
        if a in PACKED:
            packs.setdefault(a, []).append(v)
        else:
            direct.append(v)
    return direct + [np.array(packs[t], PACKED[t]) for t in PACKED if t in packs] if packs else direct


def _number(v: jax.Array, kind: type) -> jax.Array:
    """A packed number as the program's functions were traced with it: a float or an
    int weakly typed, as JAX traces a Python number (so ``x * 0.5`` keeps ``x``'s dtype)."""
    return v if kind is bool else jax_lax._convert_element_type(v, v.dtype, weak_type=True)


def replay(nodes: list, wanted: tuple, avals: list) -> Callable:
    # per input, where ``packed`` put it: (None, its place among the direct arguments)
    # or (its type, its place in that type's array)
    counts: dict[Any, int] = {}
    layout = []
    for a in avals:
        k = a if a in PACKED else None
        layout.append((k, counts.get(k, 0)))
        counts[k] = counts.get(k, 0) + 1
    n_direct = counts.get(None, 0)
    types = [t for t in PACKED if t in counts]

    def program(*flat):
        packs = dict(zip(types, flat[n_direct:]))
        return run_nodes(nodes, [flat[j] if k is None else _number(packs[k][j], k) for k, j in layout], wanted)
    return program


def run_nodes(nodes: list, inputs: list, wanted: tuple) -> list:
    """A recording's functions on ``inputs`` (inside a jit trace); the ``wanted`` results."""
    env: dict[tuple, Any] = {}
    for i, (fn, refs) in enumerate(nodes):
        args = [inputs[r] if type(r) is int else env[r] for r in refs]
        for j, leaf in enumerate(jax.tree.leaves(fn(*args))):
            env[(i, j)] = leaf
    return [env[s] for s in wanted]
