"""Eager fused optimizer steps as programs that donate and pack the state they write.

``opt.step()`` of a fused Adam, AdamW or SGD (the default for tpu parameters:
``optim_defaults.py``) is one ATen call, ``_fused_adamw_(params, grads, exp_avgs,
exp_avg_sqs, max_exp_avg_sqs, state_steps, lr=...)``. Run as a plain op, its executable
returns a new array for every parameter and moment (87 for the small GPT) and the old ones
are freed after it; on a TPU host each output costs ~5.5 µs
(``bench/results/tpu_v5e/2026-12-04-s24.md``).

Here the call runs as a ``GraphProgram`` (the machinery of a compiled ``opt.step``) of a
graph made per signature: the in-place op over placeholders, run by the impl eager would
pick. It donates what it writes (XLA updates those buffers in place) and, where
``program_packs`` is on (a TPU), carries the moments from step to step as one buffer per
dtype instead of one array each; a moment read between steps (``opt.state_dict()``,
``opt.state[p]["exp_avg"]``) is cut out of its buffer then. On a TPU v5e, the small GPT's
eager ``opt.step()`` 3.79 -> 1.96 ms, medium 5.88 -> 2.96 (and the README's loop, a
compiled loss with an eager AdamW, 6.62 -> 4.54 / 9.99 -> 7.14 ms), results bit for bit
the plain route's; on 2 CPU cores 1155 -> 797 µs of host time a step. With the step
counters' increment taken in as well (``step_counters.py``), ``bench/optimizer_step.py``
on the v5e: small GPT AdamW ``opt.step()`` 3.87 -> 1.04 ms, the loop 6.42 -> 3.88; SGD
with momentum 2.18 -> 0.78 / 4.94 -> 3.42; on 2 CPU cores 0.71x / 0.69x and 0.60x / 0.76x.

``lr`` enters the program as a 0-dim device tensor (made once per value: a scheduler
compiles nothing); the other numbers and flags are part of the signature. Calls recorded
or traced (deferred mode, a capture, a compiled graph), on several devices, that write
views or give one storage twice, of parameters not float32/bfloat16/float16, or with a
CPU ``lr`` tensor take the plain route (``run_call``).
"""
from __future__ import annotations

import functools
import os

import torch
from torch._ops import OpOverload

from tpu_kernels import devices, step_counters
from tpu_kernels.dispatch import run_call
from tpu_kernels.graph_program import GraphProgram
from tpu_kernels.lru import LRU
from tpu_kernels.registry import runtime_handler
from tpu_kernels.tensor import TpuTensor

aten = torch.ops.aten
# each in-place step -> its overload with a tensor ``lr`` (what its program calls)
TENSOR_LR = {aten._fused_adamw_.default: aten._fused_adamw_.tensor_lr,
             aten._fused_adam_.default: aten._fused_adam_.tensor_lr,
             aten._fused_sgd_.default: aten._fused_sgd_.tensor_lr}
TENSOR_LR.update({op: op for op in list(TENSOR_LR.values())})
# the arguments a step writes (and the gradients where it unscales them: ``grad_scale``)
_STATE = frozenset(("self", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "momentum_buffer_list"))
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PROGRAMS = LRU(32)     # signature -> GraphProgram
_LRS = LRU(16)         # (lr, device index) -> a 0-dim float32 tpu tensor
# TPU_KERNELS_FUSED_STEP_PROGRAMS=0: the plain route (one executable, nothing donated)
ON = os.environ.get("TPU_KERNELS_FUSED_STEP_PROGRAMS", "1") not in ("", "0")


@runtime_handler(*TENSOR_LR)
def fused_step(op: OpOverload, args: tuple, kwargs: dict) -> None:
    """``op`` (an in-place fused optimizer step) run as a donating, packing program."""
    call = _split(op, args, kwargs) if ON else None
    if call is None:
        return run_call(op, args, kwargs)
    key, tensors, counters, increment = call
    program = PROGRAMS.get(key)
    if program is None:
        program = PROGRAMS.put(key, _program(key, tensors))
    if increment is not None:      # the program adds it: the counters' old values go in
        increment.take()
    try:
        program(*tensors)
    except BaseException:
        if increment is not None:  # (they still hold their old values: torch's add, as it was)
            run_call(aten._foreach_add_.Scalar, (counters, increment.alpha), {})
        raise
    if increment is None:   # (counters whose increment it took are known already)
        step_counters.remember(counters)
    return None


def _split(op: OpOverload, args: tuple, kwargs: dict) -> tuple | None:
    """(key, tensors, step counters, their pending increment or None) of a call, or None
    where it takes the plain route (see the module's docstring). The key says what its
    graph is: the op with a tensor ``lr``, per argument a tensor list's length, a tensor,
    or a value, and the increment it takes (``step_counters.py``); the tensors are its
    inputs."""
    if not step_counters.eager_on_one_device():
        return None
    bound = dict(zip(_names(op), args))
    bound.update(kwargs)
    lr = bound["lr"]
    if not isinstance(lr, torch.Tensor):
        bound["lr"] = _lr_tensor(float(lr))
    elif type(lr) is not TpuTensor or lr.dim() or lr.dtype != torch.float32:
        return None
    if not all(p.dtype in DTYPES for p in bound["self"]):
        return None
    counters = bound.get("state_steps") or []
    increment = step_counters.pending(counters)
    written = _written(bound.get("grad_scale") is not None, increment is not None)
    parts, tensors = [], []
    for name, v in bound.items():
        if isinstance(v, (list, tuple)):
            parts.append((name, "list", len(v)))
            tensors += v
            # what it writes is donated and may be packed: whole storages
            if name in written and not all(type(t) is TpuTensor and t._tpu_direct for t in v):
                return None
        elif isinstance(v, torch.Tensor):
            parts.append((name, "tensor", None))
            tensors.append(v)
        else:
            parts.append((name, "value", v))
    # tpu tensors, each over a storage of its own (donation needs one owner)
    if not all(type(t) is TpuTensor for t in tensors) or \
            len({id(t._tpu_storage) for t in tensors}) != len(tensors):
        return None
    if increment is not None:
        parts.append(("increment", "value", increment.alpha))
    return (TENSOR_LR[op], tuple(parts)), tensors, counters, increment


@functools.cache
def _names(op: OpOverload) -> tuple[str, ...]:
    return tuple(a.name for a in op._schema.arguments)


def _written(unscales: bool, increments: bool) -> frozenset[str]:
    """The arguments a step writes: parameters and state, the gradients where it unscales
    them (given a ``grad_scale``: GradScaler), the step counters where it adds their
    pending increment."""
    extra = ("grads",) * unscales + ("state_steps",) * increments
    return _STATE.union(extra) if extra else _STATE


def _lr_tensor(lr: float) -> TpuTensor:
    key = (lr, devices.current_device())
    t = _LRS.get(key)
    if t is None:
        t = _LRS.put(key, torch.tensor(lr, dtype=torch.float32, device="tpu"))
    return t


def _program(key: tuple, tensors: list) -> GraphProgram:
    """The program of a signature: a graph of the in-place op over placeholders (run as
    eager runs it: the same impl, a Pallas kernel on a TPU) and the positions of the
    inputs it writes (what it donates and may pack)."""
    op, parts = key
    values = {name: v for name, kind, v in parts if kind == "value"}
    increment = values.get("increment")
    written = _written(("grad_scale", "tensor", None) in parts, increment is not None)
    g = torch.fx.Graph()
    positions, k = [], 0
    for name, kind, v in parts:
        if kind == "value":
            continue
        n = v if kind == "list" else 1
        nodes = [g.placeholder(f"{name}_{k + j}") for j in range(n)]
        if name in written:
            positions += range(k, k + n)
        values[name], k = (nodes if kind == "list" else nodes[0]), k + n
    schema = op._schema
    args = tuple(values[a.name] for a in schema.arguments if not a.kwarg_only)
    kwargs = {a.name: values[a.name] for a in schema.arguments if a.kwarg_only and a.name in values}
    if increment is not None:
        g.call_function(aten._foreach_add_.Scalar, (values["state_steps"], increment))
    g.call_function(op, args, kwargs)
    g.output(())
    program = GraphProgram(torch.fx.GraphModule(torch.nn.Module(), g), tensors, written=positions)
    # runs once: SGD's first step; a step whose counters were added to on their own (the
    # first: the next ones take their increment). The program after it packs.
    if values.get("is_first_step") or (values.get("state_steps") and increment is None):
        program.run_unpacked()
    return program
