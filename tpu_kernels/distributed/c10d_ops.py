"""c10d's collective ops on tpu tensors, as JAX collectives.

``dist.all_reduce(t)`` and friends call a ``c10d::*`` op (``c10d::allreduce_``, ...); on a
tpu tensor it reaches the tensor's ``__torch_dispatch__``, which hands it to the handler
registered here (``dispatch.register_runtime``). A handler checks its arguments, checks
that every rank passed the same (``checks.agree``), runs the collective as a jitted
program over the group's devices (``programs.run``), writes the results into the output
tensors, and returns a ``TpuWork``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tpu_kernels.distributed import checks, work
from tpu_kernels.distributed.groups import Group
from tpu_kernels.distributed.handlers import (bind, expect, handler, op_group, reduce_name,
                                              tpu_tensors, work_handle)
from tpu_kernels.distributed.work import CollectiveError, wait_ready
from tpu_kernels.tensor import TpuTensor
from tpu_kernels.tensor_values import value, write
c10d = torch.ops.c10d


# -- reductions and broadcast --------------------------------------------------------------------
@handler("all_reduce", "tensors")
def allreduce_(a: dict) -> Any:
    ts = tpu_tensors("all_reduce", a["tensors"])
    group = op_group(a, "all_reduce")
    op = reduce_name(a["reduce_op"], "all_reduce")
    expect("all_reduce", a.get("sparse_indices") is None, "sparse tensors are not supported")
    checks.agree("all_reduce", (op,), ts, group)
    outs = [work.run("all_reduce", group, "all_reduce", value(t), op=op) for t in ts]
    for t, o in zip(ts, outs):
        write(t, o)
    return ts, work_handle("all_reduce", group, outs, ts)


@handler("all_reduce_coalesced", None)
def allreduce_coalesced_(a: dict) -> Any:
    return allreduce_.__wrapped__(a)[1]


@handler("reduce", None)
def reduce_(a: dict) -> Any:
    ts = tpu_tensors("reduce", a["tensors"])
    group = op_group(a, "reduce")
    op = reduce_name(a["reduce_op"], "reduce")
    root = a["root_rank"]
    checks.agree("reduce", (op, root), ts, group)
    outs = [work.run("reduce", group, "all_reduce", value(t), op=op) for t in ts]
    if group.rank == root:     # the others keep their input, as with NCCL
        for t, o in zip(ts, outs):
            write(t, o)
    return work_handle("reduce", group, outs, ts)


@handler("broadcast", "tensors")
def broadcast_(a: dict) -> Any:
    ts = tpu_tensors("broadcast", a["tensors"])
    group = op_group(a, "broadcast")
    root = a["root_rank"]
    checks.agree("broadcast", (root,), ts, group)
    outs = [work.run("broadcast", group, "broadcast", value(t), root=root) for t in ts]
    for t, o in zip(ts, outs):
        write(t, o)
    return ts, work_handle("broadcast", group, outs, ts)


# -- gathers -----------------------------------------------------------------------------------------
def _gather_into_list(name: str, group: Group, inp: TpuTensor, outs: list, write_out: bool) -> list:
    pieces = work.run(name, group, "all_gather", value(inp), unstack=True)
    if write_out:
        for o, p in zip(outs, pieces):
            write(o, p)
    return list(pieces)


def _check_list(name: str, group: Group, outs: list, like: torch.Tensor, what: str) -> None:
    expect(name, len(outs) == group.size,
           f"{what} has {len(outs)} tensors, the group has {group.size} ranks: pass one per rank")
    for i, o in enumerate(outs):
        expect(name, tuple(o.shape) == tuple(like.shape) and o.dtype == like.dtype,
               f"{what}[{i}] is {o.dtype}{list(o.shape)}, the input is "
               f"{like.dtype}{list(like.shape)}: every chunk must match it")


@handler("all_gather", "output_tensors")
def allgather_(a: dict) -> Any:
    ins = tpu_tensors("all_gather", a["input_tensors"])
    group = op_group(a, "all_gather")
    arrays = []
    for inp, outs in zip(ins, a["output_tensors"]):
        tpu_tensors("all_gather", outs, "output tensor")
        _check_list("all_gather", group, outs, inp, "the output list")
        checks.agree("all_gather", (), [inp], group)
        arrays += _gather_into_list("all_gather", group, inp, outs, True)
    return a["output_tensors"], work_handle("all_gather", group, arrays, a["output_tensors"])


@handler("all_gather_coalesced", None)
def allgather_coalesced_(a: dict) -> Any:
    a = dict(a, output_tensors=a["output_lists"], input_tensors=a["input_list"])
    return allgather_.__wrapped__(a)[1]


def _root_list(name: str, group: Group, root: int, lists: list, like: torch.Tensor, what: str) -> list:
    """The list of tensors only the root passes (gather's gather_list, scatter's
    scatter_list), checked; empty on the other ranks."""
    tensors = lists[0] if lists else []
    if group.rank == root:
        tpu_tensors(name, tensors, f"{what} tensor")
        _check_list(name, group, tensors, like, what)
    else:
        expect(name, not tensors, f"only rank {root} (the root) passes a {what}")
    return tensors


@handler("gather", None)
def gather_(a: dict) -> Any:
    (inp,) = tpu_tensors("gather", a["input_tensors"])
    group = op_group(a, "gather")
    root = a["root_rank"]
    outs = _root_list("gather", group, root, a["output_tensors"], inp, "gather_list")
    checks.agree("gather", (root,), [inp], group)
    arrays = _gather_into_list("gather", group, inp, outs, group.rank == root)
    return work_handle("gather", group, arrays, a["output_tensors"])


# -- reduce-scatters ---------------------------------------------------------------------------------
@handler("reduce_scatter", "output_tensors")
def reduce_scatter_(a: dict) -> Any:
    outs = tpu_tensors("reduce_scatter", a["output_tensors"])
    group = op_group(a, "reduce_scatter")
    op = reduce_name(a["reduce_op"], "reduce_scatter")
    results = []
    for out, chunks in zip(outs, a["input_tensors"]):
        tpu_tensors("reduce_scatter", chunks, "input tensor")
        _check_list("reduce_scatter", group, chunks, out, "the input list")
        checks.agree("reduce_scatter", (op,), [out], group)
        r = work.run("reduce_scatter", group, "reduce_scatter", *[value(c) for c in chunks], op=op,
                     concat=True, shape=tuple(out.shape))
        write(out, r)
        results.append(r)
    return outs, work_handle("reduce_scatter", group, results, outs)


# -- flat buffers: all_gather_into_tensor, reduce_scatter_tensor, and their coalesced forms ----
def _flat(name: str, group: Group, out: TpuTensor, inp: TpuTensor, op: str | None) -> jax.Array:
    """All-gather ``inp`` into ``out`` (``op`` None: ``out`` holds k inputs) or reduce-scatter
    ``inp`` into ``out`` with ``op`` (``inp`` holds k outputs); returns the written result."""
    whole, part, held = (out, inp, "output") if op is None else (inp, out, "input")
    expect(name, whole.numel() == group.size * part.numel() and out.dtype == inp.dtype,
           f"the output is {out.dtype}{list(out.shape)}, the input {inp.dtype}{list(inp.shape)}: "
           f"the {held} must hold {group.size} times the other ({group.size * part.numel()} elements)")
    checks.agree(name, (op,), [inp], group)
    if op is None:
        result = work.run(name, group, "all_gather", value(inp), shape=tuple(out.shape))
    else:
        result = work.run(name, group, "reduce_scatter", value(inp), op=op, concat=True,
                          shape=tuple(out.shape))
    write(out, result)
    return result


def _flat_handlers(name: str, reduces: bool) -> tuple[Callable, Callable]:
    """The handlers of c10d's one-tensor op ``name`` and of its coalesced form."""
    def op_of(a: dict) -> str | None:
        return reduce_name(a["reduce_op"], name) if reduces else None

    @handler(name, "output_tensor")
    def single(a: dict) -> Any:
        out, inp = tpu_tensors(name, [a["output_tensor"], a["input_tensor"]])
        group = op_group(a, name)
        return out, work_handle(name, group, [_flat(name, group, out, inp, op_of(a))], out)

    @handler(name, None)
    def coalesced(a: dict) -> Any:
        outs, ins = tpu_tensors(name, a["outputs"]), tpu_tensors(name, a["inputs"])
        group = op_group(a, name)
        results = [_flat(name, group, o, i, op_of(a)) for o, i in zip(outs, ins)]
        return work_handle(name, group, results, outs)
    return single, coalesced


_allgather_base_, allgather_into_tensor_coalesced_ = _flat_handlers("all_gather_into_tensor", False)
_reduce_scatter_base_, reduce_scatter_tensor_coalesced_ = _flat_handlers("reduce_scatter_tensor", True)


@handler("scatter", "output_tensors")
def scatter_(a: dict) -> Any:
    (out,) = tpu_tensors("scatter", a["output_tensors"])
    group = op_group(a, "scatter")
    root = a["root_rank"]
    chunks = _root_list("scatter", group, root, a["input_tensors"], out, "scatter_list")
    if group.rank == root:
        inputs = [value(c) for c in chunks]
    else:
        inputs = [jnp.zeros((group.size * out.numel(),), value(out).dtype)]
    checks.agree("scatter", (root,), [out], group)
    result = work.run("scatter", group, "scatter", *inputs, root=root, concat=True,
                  shape=tuple(out.shape))
    write(out, result)
    return [out], work_handle("scatter", group, [result], [out])


# -- all-to-all ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _padder(splits: tuple[int, ...], rows: int) -> Callable:
    """[sum(splits), ...] -> [k * rows, ...]: chunk j at block j, zero-padded to ``rows``."""
    offsets = np.concatenate([[0], np.cumsum(splits)[:-1]]).astype(int)

    def pad(x):
        blocks = [jnp.pad(x[o:o + n], [(0, rows - n)] + [(0, 0)] * (x.ndim - 1))
                  for o, n in zip(offsets, splits)]
        return jnp.concatenate(blocks)
    return jax.jit(pad)


@functools.lru_cache(maxsize=256)
def _unpadder(splits: tuple[int, ...], rows: int) -> Callable:
    """[k * rows, ...] -> [sum(splits), ...]: the first ``splits[i]`` rows of block i."""
    def unpad(x):
        return jnp.concatenate([x[i * rows:i * rows + n] for i, n in enumerate(splits)])
    return jax.jit(unpad)


def all_to_all_rows(name: str, group: Group, x: jax.Array, send: list[int] | None,
                    recv: list[int] | None, out_rows: int) -> jax.Array:
    """``x``'s rows split by ``send`` (rank j gets chunk j), the result's rows by ``recv``
    (chunk i from rank i); ``None`` splits mean equal chunks."""
    k = group.size
    rest = tuple(x.shape[1:])
    if not send and not recv:
        expect(name, x.shape[0] % k == 0 and out_rows == x.shape[0],
               f"input and output need the same number of rows, divisible by {k} ranks "
               f"(got {x.shape[0]} and {out_rows}); pass split sizes for uneven chunks")
        checks.agree(name, (rest, str(x.dtype), x.shape[0]), [], group)
        return work.run(name, group, "all_to_all", x)
    send = list(send) if send else [x.shape[0] // k] * k
    recv = list(recv) if recv else [out_rows // k] * k
    expect(name, len(send) == k and len(recv) == k and sum(send) == x.shape[0] and sum(recv) == out_rows,
           f"split sizes {send} (input, {x.shape[0]} rows) and {recv} (output, {out_rows} rows) "
           f"must have one entry per rank ({k}) and add up to the rows")
    every = checks.agree(name, (rest, str(x.dtype)), [], group, extra=send + recv)
    sent, expected = every[:, :k], every[:, k:2 * k]   # [i, j]: rows i sends j / i expects from j
    for i in range(k):        # every rank checks every rank, so all of them raise together
        if list(sent[:, i]) != list(expected[i]):
            raise checks.ArgumentMismatch(
                f"tpu {name} over ranks {list(group.ranks)}: rank {group.ranks[i]} expects "
                f"{[int(v) for v in expected[i]]} rows from the ranks, they send it "
                f"{[int(v) for v in sent[:, i]]}: each rank's output_split_sizes must match "
                f"what the others' input_split_sizes send it")
    rows = max(int(sent.max()), 1)
    padded = _padder(tuple(send), rows)(x)
    mixed = work.run(name, group, "all_to_all", padded)
    return _unpadder(tuple(recv), rows)(mixed)


@handler("all_to_all_single", None)
def alltoall_base_(a: dict) -> Any:
    out, inp = tpu_tensors("all_to_all_single", [a["output"], a["input"]])
    group = op_group(a, "all_to_all_single")
    expect("all_to_all_single", out.dtype == inp.dtype and tuple(out.shape[1:]) == tuple(inp.shape[1:]),
           f"input {inp.dtype}{list(inp.shape)} and output {out.dtype}{list(out.shape)} must "
           f"agree in dtype and in every dimension but the first")
    result = all_to_all_rows("all_to_all_single", group, value(inp), a["input_split_sizes"],
                             a["output_split_sizes"], out.shape[0])
    write(out, result)
    return work_handle("all_to_all_single", group, [result], out)


@handler("all_to_all", "output_tensors")
def alltoall_(a: dict) -> Any:
    outs = tpu_tensors("all_to_all", a["output_tensors"], "output tensor")
    ins = tpu_tensors("all_to_all", a["input_tensors"], "input tensor")
    group = op_group(a, "all_to_all")
    expect("all_to_all", len(ins) == group.size and len(outs) == group.size,
           f"pass {group.size} input and {group.size} output tensors (one per rank), got "
           f"{len(ins)} and {len(outs)}")
    expect("all_to_all", len({t.dtype for t in ins + outs}) == 1, "all tensors need one dtype")
    flat = jnp.concatenate([value(t).reshape(-1) for t in ins])
    result = all_to_all_rows("all_to_all", group, flat, [t.numel() for t in ins],
                             [t.numel() for t in outs], sum(t.numel() for t in outs))
    offsets = np.cumsum([0] + [t.numel() for t in outs])
    for t, o, n in zip(outs, offsets, (t.numel() for t in outs)):
        write(t, result[o:o + n].reshape(tuple(t.shape)))
    return outs, work_handle("all_to_all", group, [result], outs)


# -- barrier and point to point ------------------------------------------------------------------------
@handler("barrier", None)
def barrier(a: dict) -> Any:
    group = op_group(a, "barrier")
    checks.agree("barrier", (), [], group)
    token = work.run("barrier", group, "barrier", np.zeros((1,), np.int32))
    return work_handle("barrier", group, [token], [])


def monitored_barrier_(op, args, kwargs) -> None:
    a = bind(op, args, kwargs)
    group = op_group(a, "monitored_barrier")
    token = work.run("monitored_barrier", group, "barrier", np.zeros((1,), np.int32))
    wait_ready([token], "monitored_barrier", group, a["timeout"] / 1000 if a["timeout"] > 0 else None)


def _p2p(name: str, a: dict, peer: int, sending: bool) -> Any:
    (t,) = tpu_tensors(name, a["tensors"])
    group = op_group(a, name)
    expect(name, 0 <= peer < group.size and peer != group.rank,
           f"peer rank {peer} is not another rank of the group (size {group.size})")
    me_g, peer_g = group.ranks[group.rank], group.ranks[peer]
    pair = tuple(sorted((me_g, peer_g)))
    src, dst = (me_g, peer_g) if sending else (peer_g, me_g)
    link = Group(f"{group.name}:{pair}", pair, pair.index(me_g), group.timeout)
    try:
        checks.agree("send/recv", (src, dst), [t], link)
    except checks.ArgumentMismatch as exc:
        raise checks.ArgumentMismatch(
            f"tpu {name} between ranks {src} -> {dst}: the peer's next send/recv does not match "
            f"it ({exc}). On tpu a send pairs with the peer's recv, in program order, with the "
            f"same shape and dtype; for exchanges in both directions use all_to_all_single") from exc
    result = work.run(name, link, "ppermute", value(t), pairs=((pair.index(src), pair.index(dst)),))
    if not sending:
        write(t, result)
    return work_handle(name, link, [result], [t])


@handler("send", None)
def send(a: dict) -> Any:
    return _p2p("send", a, a["dst"], sending=True)


@handler("recv", None)
def recv_(a: dict) -> Any:
    return _p2p("recv", a, a["src"], sending=False)


def recv_any_source_(op, args, kwargs) -> Any:
    raise NotImplementedError(
        "tpu recv: receiving from any source (src=None) is not supported: a tpu transfer is a "
        "program both ranks run. Pass src=<rank>, or use all_to_all_single / broadcast")


HANDLERS = {
    c10d.allreduce_.default: allreduce_, c10d.allreduce_coalesced_.default: allreduce_coalesced_,
    c10d.reduce_.default: reduce_, c10d.broadcast_.default: broadcast_,
    c10d.allgather_.default: allgather_, c10d.allgather_coalesced_.default: allgather_coalesced_,
    c10d._allgather_base_.default: _allgather_base_,
    c10d.allgather_into_tensor_coalesced_.default: allgather_into_tensor_coalesced_,
    c10d.gather_.default: gather_, c10d.reduce_scatter_.default: reduce_scatter_,
    c10d._reduce_scatter_base_.default: _reduce_scatter_base_,
    c10d.reduce_scatter_tensor_coalesced_.default: reduce_scatter_tensor_coalesced_,
    c10d.scatter_.default: scatter_, c10d.alltoall_base_.default: alltoall_base_,
    c10d.alltoall_.default: alltoall_, c10d.barrier.default: barrier,
    c10d.monitored_barrier_.default: monitored_barrier_, c10d.send.default: send,
    c10d.recv_.default: recv_, c10d.recv_any_source_.default: recv_any_source_,
}

__all__ = ["HANDLERS", "CollectiveError", "all_to_all_rows"]
