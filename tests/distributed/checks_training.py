"""DDP and FSDP2 training of the small GPT vs one process training on the whole batch.

Each rank trains on its slice of a batch; the reference trains one unwrapped model on the
concatenated batch in this process (on tpu, no collectives). DDP averages the ranks'
gradients, which equals the whole batch's mean loss gradient, so losses (the mean of the
ranks' losses) and parameters must agree to float32 rounding. AdamW runs with eps=1e-4:
a gradient that is zero up to rounding (the attention's key bias, which the softmax
ignores: |g| ~ 2e-10 here, against >= 1e-3 for every other parameter) moves its parameter
by about lr * |g| / (|g| + eps) a step, with a sign the rounding decides. With torch's 1e-8
that is a full-size step; with 1e-6 it was ~2e-6 a step, and over five steps two summation
orders (the reference's whole batch, the ranks' reduce-scatter; XLA:CPU's code differs by
host CPU too) parted by 2.2e-5 on an AVX-512 host, past the check's 1e-5. With 1e-4 it is
~2e-8 a step.
"""
from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from harness import check, on_rank0
from torch.nn.parallel import DistributedDataParallel as DDP

from tpu_kernels.models import GPT, GPTConfig

CFG = GPTConfig(vocab=64, seq=16, dim=32, heads=4, layers=2)
STEPS = 5
PER_RANK = 2


def _batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(21)
    return torch.randint(0, CFG.vocab, (PER_RANK * dist.get_world_size(), CFG.seq + 1), generator=g)


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(CFG)


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, eps=1e-4)


@on_rank0
def _reference() -> tuple[list[float], dict]:
    """One process, one model, the whole batch: losses and final parameters (CPU)."""
    model = _model().to("tpu")
    opt = _adamw(model.parameters())
    tokens = _batch().to("tpu")
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model.loss(tokens)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


def _mean_over_ranks(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)                                  # CPU tensors: gloo
    return (t / dist.get_world_size()).tolist()


def _train(model, batch: torch.Tensor, opt) -> list[float]:
    r = dist.get_rank()
    tokens = batch[r * PER_RANK:(r + 1) * PER_RANK].to("tpu")
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(loss.reshape(-1, CFG.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return _mean_over_ranks(losses)


def _close(losses, ref_losses, ref_params: dict, params: dict) -> None:
    torch.testing.assert_close(torch.tensor(losses, dtype=torch.float64),
                               torch.tensor(ref_losses, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


@check("ddp_gpt_5_steps", ci=(2,))
def _ddp() -> None:
    ddp = DDP(_model().to("tpu"))
    losses = _train(ddp, _batch(), _adamw(ddp.parameters()))
    _close(losses, *_reference(), {k: v.cpu() for k, v in ddp.module.state_dict().items()})


def _fsdp_model(per_layer: bool):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("tpu", (dist.get_world_size(),))
    model = _model().to("tpu")
    if per_layer:
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp(per_layer: bool) -> None:
    model = _fsdp_model(per_layer)
    assert type(model.fc.weight).__name__ == "DTensor"
    losses = _train(model, _batch(), _adamw(model.parameters()))
    _close(losses, *_reference(), {k: v.full_tensor().cpu() for k, v in model.state_dict().items()})
    _checkpoint_round_trip(model, per_layer)


def _checkpoint_round_trip(model, per_layer: bool) -> None:
    """torch.distributed.checkpoint: save the sharded state dict, load it into a fresh
    sharded model, and get every local shard back exactly."""
    import torch.distributed.checkpoint as dcp
    where = [tempfile.mkdtemp(prefix="tpu_dcp_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(where)
    dcp.save({"model": model.state_dict()}, checkpoint_id=where[0])
    fresh = _fsdp_model(per_layer)
    with torch.no_grad():
        for p in fresh.parameters():
            p.to_local().zero_()
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=where[0])
    fresh.load_state_dict(state["model"])
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        torch.testing.assert_close(b.to_local().cpu(), a.to_local().cpu(), rtol=0, atol=0,
                                   msg=lambda m: f"{name}: {m}")
    assert os.path.isdir(where[0])


check("fsdp2_per_layer_and_root_5_adamw_steps_and_dcp", ci=(2,))(lambda: _fsdp(True))
check("fsdp2_root_only_5_adamw_steps_and_dcp", ci=())(lambda: _fsdp(False))
