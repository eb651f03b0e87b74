"""Random ops recomputed by activation checkpointing under ``torch.compile``.

``torch.utils.checkpoint`` (Hugging Face's ``gradient_checkpointing_enable()``) inside a
compiled function makes AOTAutograd's partitioner recompute the checkpointed region in the
backward program. A random op there (dropout, an attention op that may drop) must draw
the same values twice, so the partitioner wraps the forward's op in
``run_and_save_rng_state`` (the generator's state before the op, and its result) and the
backward's in ``run_with_rng_state`` (the op run from that state). For a device without
graph-safe RNG, as tpu is to torch, the state is typed as a CPU generator state (a uint8
tensor of ``torch.get_rng_state()``'s size). On tpu it carries the op's key data (seed
low, seed high, counter: three uint32, ``random_state``) in its first 12 bytes.

Inside a compiled program the op's key is the graph trace's next one (``GraphTrace``);
run op by op, it is the device generator's next counter.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

from tpu_kernels import random_state
from tpu_kernels.dispatch import graph_trace
from tpu_kernels.tensor import TpuTensor, value, wrap

STATE_BYTES = torch.get_rng_state().numel()   # the state's size AOTAutograd's graph records
_KEY_BYTES = 12


@run_and_save_rng_state.py_impl(TpuTensor)
def _run_and_save(op: Callable, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    trace = graph_trace.active()
    if trace is not None:     # the key the op is about to take from the program's key input
        kd = trace.key_data + jnp.array([0, 0, trace.random_ops], jnp.uint32)
    else:                     # the device generator's next counter
        seed, counter = random_state.get_state()
        kd = jnp.asarray(random_state.key_data(seed, np.array([counter + 1]))[0])
    return _state_of(kd), op(*args, **kwargs)


@run_with_rng_state.py_impl(TpuTensor)
def _run_with(state: torch.Tensor, op: Callable, *args: Any, **kwargs: Any) -> Any:
    kd = _key_of(state)
    trace = graph_trace.active()
    if trace is not None:
        with trace.replaying_key(kd):
            return op(*args, **kwargs)
    bits = np.asarray(kd, np.uint64)
    saved = random_state.get_state()
    random_state.set_state((int(bits[0] | (bits[1] << 32)), int(bits[2]) - 1))
    try:
        return op(*args, **kwargs)
    finally:
        random_state.set_state(saved)


def _state_of(kd: jax.Array) -> TpuTensor:
    """A tpu uint8 tensor of ``STATE_BYTES`` holding ``kd``'s 12 bytes first."""
    raw = jax.lax.bitcast_convert_type(kd, jnp.uint8).reshape(-1)
    return wrap(jnp.zeros(STATE_BYTES, jnp.uint8).at[:_KEY_BYTES].set(raw), torch.uint8)


def _key_of(state: torch.Tensor) -> jax.Array:
    """The key data ``_state_of`` stored (the state comes back on the CPU or on tpu)."""
    raw = value(state) if isinstance(state, TpuTensor) else jnp.asarray(state.numpy())
    return jax.lax.bitcast_convert_type(raw[:_KEY_BYTES].reshape(3, 4), jnp.uint32)
