"""Every c10d collective on tpu tensors vs the same computation on CPU torch in one process.

Inputs come from seeds every rank knows, so each rank computes everyone's inputs and the
expected result itself. Reductions are compared with torch's default tolerance for the
dtype (the ranks' partial results add in another order than one ``sum``); data movement
(broadcast, gathers, scatters, all-to-all) must be exact.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from harness import check

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}
OPS = ("SUM", "AVG", "MIN", "MAX", "PRODUCT")
SHAPE = (3, 4)


def rank() -> int:
    return dist.get_rank()


def world() -> int:
    return dist.get_world_size()


def draw(seed: int, r: int, shape: tuple, dtype: torch.dtype, spread: int = 50) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 7919 + r)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-spread, spread, shape, generator=g, dtype=dtype)


def everyone(seed: int, shape: tuple, dtype: torch.dtype, spread: int = 50) -> list[torch.Tensor]:
    return [draw(seed, r, shape, dtype, spread) for r in range(world())]


def same(got: torch.Tensor, want: torch.Tensor, exact: bool = False) -> None:
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if exact:
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    else:
        torch.testing.assert_close(got, want)


def reduce_cpu(op: str, xs: list[torch.Tensor]) -> torch.Tensor:
    """The reduction of ``xs`` in one process (float in float64, then the dtype)."""
    dtype = xs[0].dtype
    s = torch.stack([x.double() if dtype.is_floating_point else x for x in xs])
    if op == "SUM":
        out = s.sum(0)
    elif op == "AVG":
        out = s.mean(0) if dtype.is_floating_point else torch.div(s.sum(0), len(xs), rounding_mode="trunc")
    elif op == "PRODUCT":
        out = s.prod(0)
    else:
        out = s.amin(0) if op == "MIN" else s.amax(0)
    return out.to(dtype)


def _all_reduce(op: str, dtype: torch.dtype) -> None:
    xs = everyone(1, SHAPE, dtype, spread=4 if op == "PRODUCT" else 50)
    t = xs[rank()].to("tpu")
    assert dist.all_reduce(t, op=getattr(dist.ReduceOp, op)) is None
    same(t, reduce_cpu(op, xs), exact=op in ("MIN", "MAX") or not dtype.is_floating_point)


def _broadcast(dtype: torch.dtype) -> None:
    xs = everyone(2, SHAPE, dtype)
    t = xs[rank()].to("tpu")
    dist.broadcast(t, src=world() - 1)
    same(t, xs[-1], exact=True)


def _all_gather(dtype: torch.dtype) -> None:
    xs = everyone(3, SHAPE, dtype)
    outs = [torch.empty(SHAPE, dtype=dtype, device="tpu") for _ in range(world())]
    dist.all_gather(outs, xs[rank()].to("tpu"))
    for o, x in zip(outs, xs):
        same(o, x, exact=True)
    flat = torch.empty((world() * SHAPE[0], SHAPE[1]), dtype=dtype, device="tpu")
    dist.all_gather_into_tensor(flat, xs[rank()].to("tpu"))
    same(flat, torch.cat(xs), exact=True)


def _reduce_scatter(dtype: torch.dtype) -> None:
    k = world()
    chunks = [everyone(10 + j, SHAPE, dtype) for j in range(k)]     # chunks[j][r]: rank r's j-th
    out = torch.empty(SHAPE, dtype=dtype, device="tpu")
    dist.reduce_scatter(out, [chunks[j][rank()].to("tpu") for j in range(k)])
    same(out, reduce_cpu("SUM", chunks[rank()]), exact=not dtype.is_floating_point)
    whole = everyone(4, (k * SHAPE[0], SHAPE[1]), dtype)
    out = torch.empty(SHAPE, dtype=dtype, device="tpu")
    dist.reduce_scatter_tensor(out, whole[rank()].to("tpu"), op=dist.ReduceOp.MAX)
    want = reduce_cpu("MAX", [w.chunk(k)[rank()] for w in whole])
    same(out, want, exact=True)


def _all_to_all(dtype: torch.dtype) -> None:
    k = world()
    xs = everyone(5, (k * 2, 3), dtype)
    out = torch.empty((k * 2, 3), dtype=dtype, device="tpu")
    dist.all_to_all_single(out, xs[rank()].to("tpu"))
    same(out, torch.cat([x.chunk(k)[rank()] for x in xs]), exact=True)
    outs = [torch.empty((2, 3), dtype=dtype, device="tpu") for _ in range(k)]
    dist.all_to_all(outs, [c.to("tpu") for c in xs[rank()].chunk(k)])
    for i, o in enumerate(outs):
        same(o, xs[i].chunk(k)[rank()], exact=True)


def _splits(r: int, k: int) -> list[int]:
    """Rows rank ``r`` sends to each rank: uneven, some zero."""
    return [(r + 2 * j) % 3 for j in range(k)]


def _all_to_all_uneven(dtype: torch.dtype) -> None:
    k, me = world(), rank()
    sends = [_splits(r, k) for r in range(k)]
    xs = [draw(6, r, (sum(sends[r]), 2), dtype) for r in range(k)]
    recv = [sends[r][me] for r in range(k)]
    out = torch.empty((sum(recv), 2), dtype=dtype, device="tpu")
    dist.all_to_all_single(out, xs[me].to("tpu"), output_split_sizes=recv, input_split_sizes=sends[me])
    want = torch.cat([x.split(sends[r])[me] for r, x in enumerate(xs)])
    same(out, want, exact=True)


def _reduce(dtype: torch.dtype) -> None:
    xs = everyone(7, SHAPE, dtype)
    t = xs[rank()].to("tpu")
    dist.reduce(t, dst=1)
    same(t, reduce_cpu("SUM", xs) if rank() == 1 else xs[rank()], exact=not dtype.is_floating_point)


def _gather_scatter(dtype: torch.dtype) -> None:
    xs = everyone(8, SHAPE, dtype)
    outs = [torch.empty(SHAPE, dtype=dtype, device="tpu") for _ in range(world())] if rank() == 0 else None
    dist.gather(xs[rank()].to("tpu"), outs, dst=0)
    if rank() == 0:
        for o, x in zip(outs, xs):
            same(o, x, exact=True)
    src = world() - 1
    pieces = everyone(9, SHAPE, dtype)          # the source's list: piece i for rank i
    out = torch.empty(SHAPE, dtype=dtype, device="tpu")
    dist.scatter(out, [p.to("tpu") for p in pieces] if rank() == src else None, src=src)
    same(out, pieces[rank()], exact=True)


def _send_recv(dtype: torch.dtype) -> None:
    """A ring: each rank sends to the next; even ranks send first, odd ranks receive first."""
    k, me = world(), rank()
    xs = everyone(11, SHAPE, dtype)
    got = torch.empty(SHAPE, dtype=dtype, device="tpu")
    if me % 2 == 0:
        dist.send(xs[me].to("tpu"), dst=(me + 1) % k)
        dist.recv(got, src=(me - 1) % k)
    else:
        dist.recv(got, src=(me - 1) % k)
        dist.send(xs[me].to("tpu"), dst=(me + 1) % k)
    same(got, xs[(me - 1) % k], exact=True)


for _dname, _dtype in DTYPES.items():
    _ci = (2, 4) if _dname == "float32" else (2,)      # 4 ranks x bf16/int64: thorough
    for _op in OPS:
        check(f"all_reduce/{_op}/{_dname}", ci=_ci)(functools.partial(_all_reduce, _op, _dtype))
    for _fn in (_broadcast, _all_gather, _reduce_scatter, _all_to_all, _all_to_all_uneven,
                _reduce, _gather_scatter, _send_recv):
        check(f"{_fn.__name__[1:]}/{_dname}", ci=_ci)(functools.partial(_fn, _dtype))


@check("barrier")
def _barrier() -> None:
    dist.barrier()
    dist.barrier(async_op=True).wait()


@check("async_handles")
def _async() -> None:
    xs = everyone(12, SHAPE, torch.float32)
    t = xs[rank()].to("tpu")
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() and work.is_completed()
    same(t, reduce_cpu("SUM", xs))
    outs = [torch.empty(SHAPE, device="tpu") for _ in range(world())]
    work = dist.all_gather(outs, t, async_op=True)
    fut = work.get_future()
    work.wait()
    assert isinstance(fut.wait(), list)
    for o in outs:
        same(o, reduce_cpu("SUM", xs))


@check("functional_collectives")
def _functional() -> None:
    group = dist.group.WORLD
    k = world()
    xs = everyone(13, (k * 2, 3), torch.float32)
    x = xs[rank()].to("tpu")
    same(funcol.wait_tensor(funcol.all_reduce(x, "sum", group)), reduce_cpu("SUM", xs))
    same(funcol.all_reduce(x, "max", group), reduce_cpu("MAX", xs), exact=True)
    same(funcol.all_gather_tensor(x, 0, group), torch.cat(xs), exact=True)
    same(funcol.reduce_scatter_tensor(x, "sum", 0, group), reduce_cpu("SUM", [t.chunk(k)[rank()] for t in xs]))
    same(funcol.all_to_all_single(x, None, None, group), torch.cat([t.chunk(k)[rank()] for t in xs]), exact=True)
    same(funcol.broadcast(x, 0, group), xs[0], exact=True)
    y = x.clone()
    funcol.all_reduce_inplace(y, "sum", group)
    same(y, reduce_cpu("SUM", xs))


@check("compiled_collectives_one_program", ci=(2,))
def _compiled() -> None:
    """dist.all_reduce and functional collectives inside torch.compile(backend='tpu')."""
    from tpu_kernels.compile_backend import PROGRAMS
    from tpu_kernels.distributed.compiled import SpmdProgram
    group = dist.group.WORLD
    k = world()

    def step(x):
        y = x * 2
        dist.all_reduce(y)
        g = funcol.all_gather_tensor(y + 1, 0, group)
        return g, funcol.reduce_scatter_tensor(torch.cat([x] * k), "sum", 0, group)

    before = len(PROGRAMS)
    compiled = torch.compile(step, backend="tpu")
    for seed in (14, 15):
        xs = everyone(seed, (4,), torch.float32)
        g, rs = compiled(xs[rank()].to("tpu"))
        total = reduce_cpu("SUM", [2 * x for x in xs])
        same(g, torch.cat([total + 1] * k))
        same(rs, reduce_cpu("SUM", xs))
    new = PROGRAMS[before:]
    assert len(new) == 1 and isinstance(new[0]._jitted, SpmdProgram) and new[0].traces == 1, \
        [(type(p._jitted).__name__, p.traces) for p in new]
