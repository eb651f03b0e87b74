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
import torch
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

from tpu_kernels import random_state
from tpu_kernels.dispatch import graph_trace
from tpu_kernels.tensor import TpuTensor, wrap
from tpu_kernels.tensor_values import value
STATE_BYTES = torch.get_rng_state().numel()   # the state's size AOTAutograd's graph records
_KEY_BYTES = 12


@run_and_save_rng_state.py_impl(TpuTensor)
def _run_and_save(op: Callable, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    trace = graph_trace.active()
    kd = trace.peek_key_data() if trace is not None else jnp.asarray(random_state.next_key_data())
    return _state_of(kd), op(*args, **kwargs)


@run_with_rng_state.py_impl(TpuTensor)
def _run_with(state: torch.Tensor, op: Callable, *args: Any, **kwargs: Any) -> Any:
    kd = _key_of(state)
    trace = graph_trace.active()
    with trace.replaying_key(kd) if trace is not None else random_state.replaying(kd):
        return op(*args, **kwargs)


def _state_of(kd: jax.Array) -> TpuTensor:
    """A tpu uint8 tensor of ``STATE_BYTES`` holding ``kd``'s 12 bytes first."""
    raw = jax.lax.bitcast_convert_type(kd, jnp.uint8).reshape(-1)
    return wrap(jnp.zeros(STATE_BYTES, jnp.uint8).at[:_KEY_BYTES].set(raw), torch.uint8)


def _key_of(state: torch.Tensor) -> jax.Array:
    """The key data ``_state_of`` stored (the state comes back on the CPU or on tpu)."""
    raw = value(state) if isinstance(state, TpuTensor) else jnp.asarray(state.numpy())
    return jax.lax.bitcast_convert_type(raw[:_KEY_BYTES].reshape(3, 4), jnp.uint32)
