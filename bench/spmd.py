"""A GPT training step over 8 devices of one process (``tpu_kernels.spmd``) vs one device.

    python -m tpu_kernels.bench.spmd

Runs on JAX's CPU backend with ``--xla_force_host_platform_device_count=8`` (set here,
before jax starts): 8 "devices" share this machine's cores, so the figure says what SPMD
costs in dispatch and collectives here, not what a pod gains. Prints, per mode (eager,
``torch.compile``), the median seconds of an AdamW step of the same GPT on the same batch:
unsharded on one device, and with FSDP over 8 (parameters and moments sharded), and
their ratio, all from this one run.
"""
from __future__ import annotations

import argparse
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch  # noqa: E402

from tpu_kernels import spmd  # noqa: E402
from tpu_kernels.bench.timing import measure  # noqa: E402  (imports the tpu device and backend)
from tpu_kernels.models import GPT, GPTConfig, train_step  # noqa: E402

CFG = GPTConfig(vocab=256, seq=64, dim=128, heads=4, layers=2)
BATCH = 16


def _step(shard: bool, compiled: bool):
    torch.manual_seed(0)
    model = GPT(CFG).to("tpu")
    if shard:
        spmd.fsdp(model, spmd.Mesh((8,), ("fsdp",)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, CFG.vocab, (BATCH, CFG.seq + 1),
                           generator=torch.Generator().manual_seed(0)).to("tpu")
    loss_fn = torch.compile(model.loss, backend="tpu") if compiled else None
    return lambda: train_step(model, opt, (tokens,), loss_fn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    print(f"GPT {CFG}, batch {BATCH}; median of {args.iters} AdamW steps after 2 warm-up")
    for mode in ("eager", "compiled"):
        one, eight = (measure(_step(shard, mode == "compiled"), warmup=2,
                              iters=args.iters)["median"] for shard in (False, True))
        print(f"{mode:9s} 1 device {one * 1e3:8.1f} ms   FSDP over 8 devices "
              f"{eight * 1e3:8.1f} ms   ratio {eight / one:5.2f}")


if __name__ == "__main__":
    main()
