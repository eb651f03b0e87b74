"""Functional collectives (``torch.distributed._functional_collectives``) on tpu tensors.

DTensor and compiled graphs speak these: ``_c10d_functional::all_reduce(input, "sum",
group_name) -> Tensor`` returns a new tensor instead of writing into its input, and
``wait_tensor`` marks where the result is needed. Eager, each runs the same jitted
collective program as c10d's ops; on traced values (inside the one program of a compiled
graph, see ``compiled.py``) the collective's body is traced into that program. The
values are JAX arrays already ordered by data dependence, so ``wait_tensor`` is the
identity.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import torch
import torch.distributed._functional_collectives  # noqa: F401  (defines _c10d_functional._wrap_tensor_autograd)

from tpu_kernels.distributed import checks, compiled, groups, work
from tpu_kernels.distributed.c10d_ops import all_to_all_rows
from tpu_kernels.distributed.handlers import bind, expect, reduce_name, tpu_tensors
from tpu_kernels.distributed.groups import Group
from tpu_kernels.tensor import TpuTensor, wrap
from tpu_kernels.tensor_values import read, value, write
f = torch.ops._c10d_functional
fa = torch.ops._c10d_functional_autograd


def _group(group_name: Any, collective: str) -> Group:
    if isinstance(group_name, str):
        return groups.named(group_name, collective)
    return groups.of(group_name, collective)


def _traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def collective(name: str, group: Group, kind: str, t: TpuTensor | list, params: tuple = (),
               **frame: Any) -> jax.Array:
    """Run ``kind`` on ``t``'s value(s): traced into the enclosing compiled program, or
    eagerly after checking that every rank agrees on the arguments."""
    ts = t if isinstance(t, list) else [t]
    xs = [read(x) for x in ts]
    if any(_traced(x) for x in xs):
        return compiled.in_program(name, group, kind, xs, dict(params), **frame)
    checks.agree(name, (kind, params), ts, group)
    return work.run(name, group, kind, *[value(x) for x in ts], **frame, **dict(params))


def _k(group: Group, group_size: int, name: str) -> None:
    expect(name, group_size == group.size,
           f"group_size {group_size} but the group has {group.size} ranks")


# -- handlers (fn(a) with arguments by name) --------------------------------------------------------------
def all_reduce(a: dict) -> TpuTensor:
    group = _group(a["group_name"], "all_reduce")
    (t,) = tpu_tensors("all_reduce", [a["input"]])
    op = reduce_name(a["reduce_op"], "all_reduce")
    return wrap(collective("all_reduce", group, "all_reduce", t, (("op", op),)), t.dtype)


def all_reduce_(a: dict) -> TpuTensor:
    write(a["input"], all_reduce(a)._tpu_storage.array)
    return a["input"]


def all_reduce_coalesced(a: dict) -> list[TpuTensor]:
    return [all_reduce(dict(a, input=t)) for t in a["inputs"]]


def all_reduce_coalesced_(a: dict) -> list[TpuTensor]:
    return [all_reduce_(dict(a, input=t)) for t in a["inputs"]]


def all_gather_into_tensor(a: dict) -> TpuTensor:
    group = _group(a["group_name"], "all_gather_into_tensor")
    _k(group, a["group_size"], "all_gather_into_tensor")
    (t,) = tpu_tensors("all_gather_into_tensor", [a["input"]])
    shape = (group.size * t.shape[0], *t.shape[1:]) if t.dim() else (group.size,)
    out = collective("all_gather_into_tensor", group, "all_gather", t, shape=shape)
    return wrap(out, t.dtype)


def all_gather_into_tensor_out(a: dict) -> TpuTensor:
    write(a["out"], all_gather_into_tensor(a)._tpu_storage.array)
    return a["out"]


def all_gather_into_tensor_coalesced(a: dict) -> list[TpuTensor]:
    return [all_gather_into_tensor(dict(a, input=t)) for t in a["inputs"]]


def reduce_scatter_tensor(a: dict) -> TpuTensor:
    name = "reduce_scatter_tensor"
    group = _group(a["group_name"], name)
    _k(group, a["group_size"], name)
    (t,) = tpu_tensors(name, [a["input"]])
    expect(name, t.dim() > 0 and t.shape[0] % group.size == 0,
           f"input {t.dtype}{list(t.shape)}: its first dimension must divide by {group.size} ranks")
    op = reduce_name(a["reduce_op"], name)
    shape = (t.shape[0] // group.size, *t.shape[1:])
    out = collective(name, group, "reduce_scatter", t, (("op", op),), concat=True, shape=shape)
    return wrap(out, t.dtype)


def reduce_scatter_tensor_out(a: dict) -> TpuTensor:
    write(a["out"], reduce_scatter_tensor(a)._tpu_storage.array)
    return a["out"]


def reduce_scatter_tensor_coalesced(a: dict) -> list[TpuTensor]:
    return [reduce_scatter_tensor(dict(a, input=t)) for t in a["inputs"]]


def broadcast(a: dict) -> TpuTensor:
    group = _group(a["group_name"], "broadcast")
    (t,) = tpu_tensors("broadcast", [a["input"]])
    return wrap(collective("broadcast", group, "broadcast", t, (("root", a["src"]),)), t.dtype)


def broadcast_(a: dict) -> TpuTensor:
    write(a["input"], broadcast(a)._tpu_storage.array)
    return a["input"]


def all_to_all_single(a: dict) -> TpuTensor:
    name = "all_to_all_single"
    group = _group(a["group_name"], name)
    (t,) = tpu_tensors(name, [a["input"]])
    send, recv = list(a["input_split_sizes"] or []), list(a["output_split_sizes"] or [])
    x = read(t)
    if _traced(x):
        even = [t.shape[0] // group.size] * group.size
        expect(name, send in ([], even) and recv in ([], even),
               f"uneven split sizes {send} / {recv} inside a compiled graph: a compiled tpu "
               f"program has one shape on every rank; use equal splits or run it eagerly")
        return wrap(compiled.in_program(name, group, "all_to_all", [x], {}), t.dtype)
    rows = sum(recv) if recv else t.shape[0]
    return wrap(all_to_all_rows(name, group, value(t), send, recv, rows), t.dtype)


def shard_dim_alltoall(a: dict) -> TpuTensor:
    name = "shard_dim_alltoall"
    group = _group(a["group_name"], name)
    (t,) = tpu_tensors(name, [a["input"]])
    gd, sd = a["gather_dim"] % max(t.dim(), 1), a["shard_dim"] % max(t.dim(), 1)
    if gd == sd:     # concatenating then cutting along one dim gives back this rank's block
        return wrap(value(t) if not _traced(read(t)) else read(t), t.dtype)
    if t.shape[sd] % group.size == 0:
        params = (("gather_dim", gd), ("shard_dim", sd))
        return wrap(collective(name, group, "shard_dim_alltoall", t, params), t.dtype)
    expect(name, not _traced(read(t)),
           f"dimension {sd} of {list(t.shape)} does not divide by {group.size} ranks inside a "
           f"compiled graph (ranks would get different shapes)")
    stacked = collective(name, group, "all_gather", t)
    whole = jax.numpy.concatenate(list(stacked), axis=gd)
    n = whole.shape[sd]
    size = -(-n // group.size)           # torch.chunk's: the last chunks may be short or empty
    start = min(group.rank * size, n)
    return wrap(jax.lax.slice_in_dim(whole, start, min(start + size, n), axis=sd), t.dtype)


def wait_tensor(a: dict) -> TpuTensor:
    return a["tensor"]


def _refuse_p2p(a: dict) -> Any:
    raise NotImplementedError(
        "tpu functional send/recv (isend, irecv, batch_p2p_ops) are not supported: use "
        "dist.send / dist.recv (a send pairs with the peer's recv, in order), or "
        "all_to_all_single for exchanges")


_BY_NAME: dict[str, Callable[[dict], Any]] = {
    "all_reduce": all_reduce, "all_reduce_": all_reduce_,
    "all_reduce_coalesced": all_reduce_coalesced, "all_reduce_coalesced_": all_reduce_coalesced_,
    "all_gather_into_tensor": all_gather_into_tensor,
    "all_gather_into_tensor_out": all_gather_into_tensor_out,
    "all_gather_into_tensor_coalesced": all_gather_into_tensor_coalesced,
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "reduce_scatter_tensor_out": reduce_scatter_tensor_out,
    "reduce_scatter_tensor_coalesced": reduce_scatter_tensor_coalesced,
    "broadcast": broadcast, "broadcast_": broadcast_, "all_to_all_single": all_to_all_single,
    "wait_tensor": wait_tensor, "isend": _refuse_p2p, "irecv": _refuse_p2p,
    "batch_p2p_ops": _refuse_p2p,
}


def _handler(fn: Callable[[dict], Any]) -> Callable:
    def run(op, args, kwargs):
        return fn(bind(op, args, kwargs))
    run.__name__ = fn.__name__
    return run


def handlers() -> dict:
    """Every functional collective overload on tpu tensors -> its handler."""
    out = {}
    for ns in (f, fa):
        for name, fn in _BY_NAME.items():
            packet = getattr(ns, name, None)
            if packet is not None:
                for overload in packet.overloads():
                    out[getattr(packet, overload)] = _handler(fn)
    out[torch.ops._dtensor.shard_dim_alltoall.default] = _handler(shard_dim_alltoall)
    out[f._wrap_tensor_autograd.default] = _handler(lambda a: a["input"])
    return out
