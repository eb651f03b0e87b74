"""Collectives and data-parallel training steps on tpu vs CPU, under torchrun.

    python -m torch.distributed.run --nproc-per-node 2 -m tpu_kernels.bench.distributed

Every rank joins one group ``"cpu:gloo,tpu:tpu"``: CPU tensors take torch's gloo backend,
tpu tensors the tpu backend (jitted ``shard_map`` programs; on a machine without a TPU
JAX runs them over its own gloo). Rank 0 prints, per case, the median seconds on tpu,
the reference, and their ratio, all from this one run:

- ``all_reduce`` of 1 MiB and 64 MiB float32: tpu tensors vs CPU tensors (gloo);
- a DDP and an FSDP2 (per-layer and root) AdamW step of the small GPT, each rank on its
  slice of the batch, vs one process (rank 0, the others waiting) on the whole batch.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from tpu_kernels.bench.timing import measure  # noqa: E402  (imports the tpu device and backend)
from tpu_kernels.models import GPT, GPTConfig  # noqa: E402

CFG = GPTConfig(vocab=256, seq=64, dim=128, heads=4, layers=2)
PER_RANK = 4


def _all_reduce(device: str, mib: int) -> Callable[[], Any]:
    t = torch.ones(mib * 2**20 // 4, device=device)
    return lambda: dist.all_reduce(t) or t


def _train_step(model: torch.nn.Module, tokens: torch.Tensor) -> Callable[[], Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, CFG.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss
    return step


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(CFG).to("tpu")


def _tokens(rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, CFG.vocab, (rows, CFG.seq + 1), generator=g).to("tpu")


def _ddp() -> Callable[[], Any]:
    return _train_step(DistributedDataParallel(_gpt()), _tokens(PER_RANK))


def _fsdp() -> Callable[[], Any]:
    mesh = init_device_mesh("tpu", (dist.get_world_size(),))
    model = _gpt()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return _train_step(model, _tokens(PER_RANK))


def _single() -> Callable[[], Any]:
    return _train_step(_gpt(), _tokens(PER_RANK * dist.get_world_size()))


def _median(make: Callable[[], Callable[[], Any]], iters: int, everyone: bool = True) -> float | None:
    """Median seconds of ``make()``'s call on every rank (``everyone``) or on rank 0 alone."""
    seconds = None
    if everyone or dist.get_rank() == 0:
        seconds = measure(make(), warmup=2, iters=iters)["median"]
    dist.barrier()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    dist.init_process_group("cpu:gloo,tpu:tpu")
    k = dist.get_world_size()
    rows = []
    for mib in (1, 64):
        tpu = _median(lambda: _all_reduce("tpu", mib), args.iters)
        cpu = _median(lambda: _all_reduce("cpu", mib), args.iters)
        rows.append((f"all_reduce {mib} MiB f32", tpu, f"gloo CPU {cpu * 1e3:.2f} ms", tpu / cpu))
    single = _median(_single, args.iters, everyone=False)
    for name, make in (("DDP step", _ddp), ("FSDP2 step", _fsdp)):
        t = _median(make, args.iters)
        if single is not None:
            rows.append((f"{name} (GPT, {PER_RANK}/rank)", t, f"1 process {single * 1e3:.2f} ms", t / single))
    if dist.get_rank() == 0:
        print(f"{k} processes; median of {args.iters} calls (rank 0)")
        for name, t, ref, ratio in rows:
            print(f"{name:28s} tpu {t * 1e3:9.2f} ms   {ref:24s} ratio {ratio:6.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
