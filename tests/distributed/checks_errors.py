"""Bad arguments raise errors that name the collective and the fix, on every rank, and the
group keeps working afterwards."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from checks_collectives import everyone, rank, reduce_cpu, same, world
from harness import check


def _raises(exc: type, fn: Callable, *words: str) -> None:
    try:
        fn()
    except exc as e:
        text = str(e)
        missing = [w for w in words if w not in text]
        assert not missing, f"{type(e).__name__} lacks {missing}: {text}"
    else:
        raise AssertionError(f"no {exc.__name__} raised")


def _still_works() -> None:
    xs = everyone(40, (2,), torch.float32)
    t = xs[rank()].to("tpu")
    dist.all_reduce(t)
    same(t, reduce_cpu("SUM", xs))


@check("error/mismatched_shapes_across_ranks", ci=(2,), thorough=())
def _shapes() -> None:
    t = torch.ones(3 + rank(), device="tpu")
    _raises(ValueError, lambda: dist.all_reduce(t), "all_reduce", "float32[3]", "float32[4]",
            "same shape")
    _still_works()


@check("error/different_collectives_across_ranks", ci=(2,), thorough=())
def _different() -> None:
    t = torch.ones(3, device="tpu")
    call = (lambda: dist.all_reduce(t)) if rank() == 0 else (lambda: dist.broadcast(t, src=0))
    _raises(ValueError, call, "different arguments")
    _still_works()


@check("error/tensor_on_wrong_device", ci=(2,), thorough=())
def _device() -> None:
    outs = [torch.empty(2) for _ in range(world())]            # CPU outputs, tpu input
    _raises(ValueError, lambda: dist.all_gather(outs, torch.ones(2, device="tpu")),
            "all_gather", "cpu", ".to('tpu')")
    _still_works()


@check("error/unsupported_reduce_op", ci=(2,), thorough=())
def _premul() -> None:
    op = dist._make_nccl_premul_sum(2.0)
    _raises(NotImplementedError, lambda: dist.all_reduce(torch.ones(2, device="tpu"), op=op),
            "all_reduce", "PREMUL_SUM", "SUM")
    _still_works()


@check("error/recv_from_any_source", ci=(2,), thorough=())
def _any_source() -> None:
    _raises(NotImplementedError, lambda: dist.recv(torch.empty(2, device="tpu")), "src", "all_to_all_single")
    _still_works()


@check("error/uneven_split_sizes_disagree", ci=(2,), thorough=())
def _splits() -> None:
    x = torch.ones(3, device="tpu")
    out = torch.empty(3, device="tpu")
    # rank 0 sends [1, 2] (one row to itself) but claims to receive [2, 1]
    send, recv = ([1, 2], [2, 1]) if rank() == 0 else ([2, 1], [2, 1])
    _raises(ValueError, lambda: dist.all_to_all_single(out, x, recv, send), "all_to_all_single",
            "output_split_sizes")
    _still_works()


@check("error/send_without_matching_recv", ci=(2,), thorough=())
def _both_send() -> None:
    t = torch.ones(2, device="tpu")
    _raises(ValueError, lambda: dist.send(t, dst=1 - rank()), "send", "recv", "all_to_all_single")
    _still_works()
