"""DeviceMesh, DTensor, tensor parallelism and sub-groups on tpu vs one process on CPU."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from checks_collectives import everyone, rank, reduce_cpu, same, world
from harness import check
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from tpu_kernels.models import GPT, GPTConfig


def _mesh():
    """2 x 2 on four ranks (dp, tp), 1 x 2 on two."""
    shape = (2, 2) if world() == 4 else (1, world())
    return init_device_mesh("tpu", shape, mesh_dim_names=("dp", "tp"))


@check("dtensor_distribute_redistribute", ci=(4,))
def _dtensor() -> None:
    mesh = _mesh()
    g = torch.Generator().manual_seed(31)
    a, b = torch.randn(8, 6, generator=g), torch.randn(6, 4, generator=g)
    da = distribute_tensor(a.to("tpu"), mesh, [Shard(0), Shard(1)])
    assert da.to_local().shape == (8 // mesh.size(0), 6 // mesh.size(1))
    same(da.full_tensor(), a, exact=True)
    same(da.redistribute(mesh, [Replicate(), Shard(0)]).full_tensor(), a, exact=True)
    same(da.redistribute(mesh, [Shard(1), Replicate()]).full_tensor(), a, exact=True)
    db = distribute_tensor(b.to("tpu"), mesh, [Replicate(), Replicate()])
    same((da @ db).full_tensor(), a @ b)
    same((da * 2).sum().full_tensor(), (a * 2).sum())


def _tp_models():
    cfg = GPTConfig(vocab=64, seq=16, dim=32, heads=4, layers=1)
    torch.manual_seed(0)
    ref = GPT(cfg)
    model = GPT(cfg)
    model.load_state_dict(ref.state_dict())
    model = model.to("tpu")
    tp = _mesh()["tp"]
    # Megatron MLP (column then row parallel: one all-reduce); attention's fused qkv is
    # column parallel with DTensor outputs (q, k, v come from one split), proj row parallel
    plan = {"mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel(),
            "attn.qkv": ColwiseParallel(use_local_output=False), "attn.proj": RowwiseParallel()}
    for block in model.blocks:
        parallelize_module(block, tp, plan)
    return model, ref


@check("tensor_parallel_gpt_mlp_attention", ci=(4,))
def _tensor_parallel() -> None:
    model, ref = _tp_models()
    assert type(model.blocks[0].mlp[0].weight).__name__ == "DTensor"
    g = torch.Generator().manual_seed(32)
    tokens = torch.randint(0, 64, (2, 17), generator=g)
    logits = model(tokens[:, :-1].to("tpu"))
    same(logits, ref(tokens[:, :-1]))
    model.loss(tokens.to("tpu")).backward()
    ref.loss(tokens).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        torch.testing.assert_close(grad.cpu(), q.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


@check("subgroups_new_group_and_mesh_dims", ci=(4,), thorough=())
def _subgroups() -> None:
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    strided = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    mine = pairs[rank() // 2]
    xs = everyone(33, (5,), torch.float32)
    t = xs[rank()].to("tpu")
    dist.all_reduce(t, group=mine)
    same(t, reduce_cpu("SUM", xs[2 * (rank() // 2):2 * (rank() // 2) + 2]))
    t = xs[rank()].to("tpu")
    dist.broadcast(t, group=strided[rank() % 2], group_src=1)
    same(t, xs[rank() % 2 + 2], exact=True)
    mesh = _mesh()
    tp, dp = mesh["tp"].get_group(), mesh["dp"].get_group()
    t = xs[rank()].to("tpu")
    dist.all_reduce(t, group=dp, op=dist.ReduceOp.MAX)
    same(t, reduce_cpu("MAX", [xs[rank() % 2], xs[rank() % 2 + 2]]), exact=True)
    out = funcol.all_gather_tensor(xs[rank()].to("tpu"), 0, tp)
    same(out, torch.cat(xs[2 * (rank() // 2):2 * (rank() // 2) + 2]), exact=True)


@check("compiled_mesh_dim_collectives", ci=(4,), thorough=())
def _compiled_mesh() -> None:
    """Collectives over both dims of a 2 x 2 mesh inside one compiled program."""
    mesh = _mesh()
    tp, dp = mesh["tp"].get_group(), mesh["dp"].get_group()

    def step(x):
        return funcol.all_reduce(x, "sum", tp) * 10 + funcol.all_reduce(x, "max", dp)

    xs = everyone(34, (3,), torch.float32)
    out = torch.compile(step, backend="tpu")(xs[rank()].to("tpu"))
    row = 2 * (rank() // 2)
    want = reduce_cpu("SUM", xs[row:row + 2]) * 10 + reduce_cpu("MAX", [xs[rank() % 2], xs[rank() % 2 + 2]])
    same(out, want)
