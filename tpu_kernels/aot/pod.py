"""One training step of a model compiled as one SPMD program for a TPU pod slice.

    python -m tpu_kernels aot --model llama3-8b --mesh fsdp=64,tp=4 --topology v5e:16x16

The model is built on abstract tpu tensors (no weights), its parameters are laid out over a
mesh of the slice's compile-only devices with ``tpu_kernels.spmd`` (tensor parallelism over
"tp", expert parallelism over "ep", then FSDP over "fsdp"), and its
``torch.compile(backend="tpu")`` forward and backward graphs are captured as for one chip.
The step is one jitted program: the forward graph, the backward graph fed the forward's
saved tensors, and AdamW (f32 moments, sharded as the parameters) updating the parameters
in place; the batch is split over the data axes ("fsdp", "dp", "ep"). XLA's partitioner inserts
the collectives. The report gives the per-chip HBM, the collectives in the optimised HLO
(``collectives.py``: counts, bytes, how many overlap compute), XLA's step estimate and MFU.
By default the step compiles with libtpu's async-collective options (``overlap.py``;
``async_collectives=False``, ``--sync-collectives``: libtpu's defaults); ``remat=True``
(``--remat``) checkpoints each decoder layer (``remat.py``): the backward recomputes the
layer's activations instead of keeping them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import math
from typing import Any
from unittest import mock

import jax
import jax.numpy as jnp
import torch

from tpu_kernels import shadow, spmd, spmd_kernels, spmd_moe, strided, transformers_moe
from tpu_kernels.aot import collectives, graphs, overlap, topology
from tpu_kernels.aot.remat import checkpoint_layers
from tpu_kernels.aot.compiler import compile_lowered
from tpu_kernels.dispatch import memory
from tpu_kernels.aot.configs import ModelSpec, model_flops_per_token
from tpu_kernels.aot.summary import Summary
from tpu_kernels.aot.training import build
from tpu_kernels.graph_program import GraphProgram, _static, settings
from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry import REGISTRY
from tpu_kernels.storage import Storage, read_view

# the batch is split over these mesh axes; "ep" too: outside the experts each device of an
# expert group holds its own tokens (expert parallelism inside data parallelism, as GShard)
DATA_AXES = ("fsdp", "dp", "ep")
# Megatron-style plan for Llama/Qwen-shaped decoders: attention heads and FFN columns over
# "tp" (q/k/v, gate/up column-wise; o/down row-wise), stacked experts over "ep" (dim 0);
# the LM head vocab-parallel (vocab over "tp", then hidden over "fsdp"): with its vocab over
# "fsdp", the batch's axis, XLA gathered every token's hidden state onto every chip
TP_PLAN = {"*.q_proj": "colwise", "*.k_proj": "colwise", "*.v_proj": "colwise",
           "*.o_proj": "rowwise", "*.mlp.gate_proj": "colwise", "*.mlp.up_proj": "colwise",
           "*.mlp.down_proj": "rowwise", "lm_head": "colwise"}
EP_PLAN = {"*.experts": {"gate_up_proj": ("ep", None, None), "down_proj": ("ep", None, None)}}
_ADAMW = dict(lr=1e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1)


def parse_mesh(text: str) -> dict[str, int]:
    """``"fsdp=64,tp=4"`` -> ``{"fsdp": 64, "tp": 4}``."""
    axes = {}
    for part in filter(None, text.split(",")):
        name, _, size = part.partition("=")
        if not size.isdigit():
            raise ValueError(f"--mesh takes AXIS=SIZE,... (e.g. fsdp=64,tp=4), not {text!r}")
        axes[name.strip()] = int(size)
    return axes


def pod_mesh(topology_name: str, axes: dict[str, int]) -> tuple[spmd.Mesh, str]:
    """A mesh over every device of a compile-only slice (``"v5e:16x16"``), and its chip."""
    chip = tpu_info.chip(topology_name.partition(":")[0]).name
    topology.device(chip)        # loads libtpu with the environment it needs
    from jax.experimental.topologies import get_topology_desc
    devices = get_topology_desc(platform="tpu", topology_name=topology_name).devices
    if math.prod(axes.values()) != len(devices):
        raise ValueError(f"--mesh {axes} has {math.prod(axes.values())} devices, "
                         f"{topology_name} has {len(devices)}")
    return spmd.Mesh(tuple(axes.values()), tuple(axes), devices), chip


@dataclasses.dataclass
class PodReport:
    model: str
    topology: str
    chip: str
    mesh: dict[str, int]
    params: int
    tokens: int
    model_flops: float               # per step, all chips together
    summary: Summary                 # per chip (the SPMD program each chip runs)
    comms: collectives.Report
    hlo: str = dataclasses.field(default="", repr=False)    # the optimised HLO, per chip
    async_collectives: bool = True   # compiled with overlap.ASYNC_COLLECTIVES
    remat: bool = False              # each decoder layer checkpointed

    @property
    def chips(self) -> int:
        return math.prod(self.mesh.values())

    @property
    def fits(self) -> bool:
        return self.summary.hbm_bytes <= tpu_info.chip(self.chip).hbm_bytes

    def as_json(self) -> dict:
        s = self.summary
        return dict(model=self.model, topology=self.topology, chip=self.chip, mesh=self.mesh,
                    params=self.params, tokens=self.tokens, model_flops=self.model_flops,
                    peak_hbm_bytes=s.hbm_bytes, argument_bytes=s.argument_bytes,
                    output_bytes=s.output_bytes, alias_bytes=s.alias_bytes,
                    temp_bytes=s.temp_bytes, step_seconds=s.optimal_seconds, mfu=self.mfu,
                    uncosted_seconds=s.uncosted_seconds,
                    compile_seconds=s.compile_seconds,
                    collectives={k: dict(count=n, bytes=b)
                                 for k, (n, b) in self.comms.by_kind().items()},
                    overlapped_fraction=self.comms.overlapped_fraction,
                    overlapped_bytes=self.comms.overlapped_bytes, loops=s.loops,
                    overlap_by_kind=self.comms.overlap_by_kind(),
                    async_collectives=self.async_collectives, remat=self.remat)

    @property
    def mfu(self) -> float:
        peak = tpu_info.chip(self.chip).bf16_flops * self.chips
        return self.model_flops / (self.summary.optimal_seconds * peak)

    def format(self) -> str:
        gib = 1 / tpu_info.GiB
        s, row = self.summary, tpu_info.chip(self.chip)
        mesh = ",".join(f"{k}={v}" for k, v in self.mesh.items())
        fits = "fits" if self.fits else "DOES NOT FIT"
        return "\n".join([
            f"{self.model} on {self.topology} ({self.chips} chips, mesh {mesh}): "
            f"{self.params / 1e9:.2f} B parameters, {self.tokens} tokens per step "
            f"(compiled in {s.compile_seconds:.0f} s"
            + (", async-collective options" if self.async_collectives else "")
            + (", layers rematerialised" if self.remat else "") + ")",
            f"  per-chip HBM: arguments {s.argument_bytes * gib:.2f} GiB, outputs "
            f"{s.output_bytes * gib:.2f} GiB (aliased {s.alias_bytes * gib:.2f}), temporaries "
            f"{s.temp_bytes * gib:.2f} GiB; peak {s.hbm_bytes * gib:.2f} GiB of "
            f"{row.hbm_bytes * gib:.0f} GiB: {fits}",
            self.comms.format("  "),
            f"  XLA's estimate: {s.optimal_seconds * 1e3:.1f} ms per step, "
            f"{s.flops:.3g} FLOPs per chip; {self.model_flops:.3g} model FLOPs -> MFU "
            f"{self.mfu:.1%} of {self.chips} x {row.bf16_flops / 1e12:.0f} TFLOP/s"
            + (f" (a lower bound: {s.loops} loops)" if s.loops else ""),
            f"  Mosaic kernels: {len(s.kernels)}",
        ])


def shard_model(model: torch.nn.Module, mesh: spmd.Mesh) -> None:
    """Lay the parameters out: TP and EP plans where the mesh has those axes, then FSDP."""
    names = {n for n, _ in model.named_modules()}
    for axis, plan in (("tp", TP_PLAN), ("ep", EP_PLAN)):
        if axis in mesh.shape:
            used = {k: v for k, v in plan.items()
                    if any(fnmatch.fnmatchcase(n, k) for n in names)}
            if used:
                spmd.tensor_parallel(model, mesh, used, axis=axis)
    if "fsdp" in mesh.shape:
        spmd.fsdp(model, mesh, "fsdp")


def compile_pod_step(spec: ModelSpec, topology_name: str, axes: dict[str, int],
                     batch: int | None = None, *, async_collectives: bool = True,
                     remat: bool = False) -> PodReport:
    """Compile ``spec``'s training step for every chip of ``topology_name`` over ``axes``.
    ``batch`` defaults to the spec's batch per data shard times the data axes' size;
    ``async_collectives`` compiles with ``overlap.ASYNC_COLLECTIVES``; ``remat``
    checkpoints each decoder layer."""
    mesh, chip = pod_mesh(topology_name, axes)
    data = tuple(a for a in DATA_AXES if a in mesh.shape)
    batch = batch or spec.batch * mesh.size(data)
    spec = dataclasses.replace(spec, batch=batch)
    model, tokens = build(spec)
    transformers_moe.use(model)     # MoE experts as one op: all_to_all expert parallelism
    if remat:
        checkpoint_layers(model)
    shard_model(model, mesh)
    spmd.mark_sharding(tokens, mesh, (data or None, None))
    # XLA lowerings only (a Mosaic kernel in a GSPMD program would need its operands whole),
    # but for attention: the flash kernel per shard in a shard_map (flash_attention below).
    # The graphs are traced at global shapes for the pod's memory, not this host's: the
    # dispatcher's guard against results that cannot fit here does not apply.
    experts = tuple(a for a in ("ep",) if a in mesh.shape)
    with tpu_info.compile_for(chip), REGISTRY.only("xla"), \
            mock.patch.object(memory, "GUARD_MIN_BYTES", math.inf), \
            spmd_moe.expert_parallel(mesh.jax, data, experts), flash_attention(mesh, data):
        fw, bw = graphs.capture(spec.loss, model, tokens)
        step, args, shardings, donate = _step(fw, bw, model, mesh)
        jitted = jax.jit(step, out_shardings=shardings, donate_argnums=donate)
        compiled = compile_lowered(lambda: jitted.lower(*args), chip,
                                   overlap.compiler_options(async_collectives))
    n_tokens = spec.batch * spec.seq
    return PodReport(spec.name, topology_name, chip, dict(axes),
                     sum(p.numel() for p in model.parameters()), n_tokens,
                     model_flops_per_token(spec, model) * n_tokens, compiled.summary,
                     collectives.analyse(compiled.as_text()), compiled.as_text(),
                     async_collectives, remat)


# the fused attention ops SDPA reaches, run by the flash Pallas kernel per shard
_FLASH_OPS = ("_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_flash_attention_for_cpu_backward")


@contextlib.contextmanager
def flash_attention(mesh: spmd.Mesh, data: tuple[str, ...]):
    """SDPA as the flash kernel run per shard (batch over ``data``, heads over "tp"):
    a shard_map (``spmd_kernels.attention_parallel``), since the compile-only client has
    no partitioner for the kernel; where that layout does not divide, XLA's attention."""
    heads = tuple(a for a in ("tp",) if a in mesh.shape)
    with contextlib.ExitStack() as stack:
        stack.enter_context(spmd_kernels.attention_parallel(mesh.jax, data, heads))
        for name in _FLASH_OPS:
            op = getattr(torch.ops.aten, name).default
            impl = next(i for i in REGISTRY.impls(op) if i.kind == "pallas")
            stack.enter_context(REGISTRY.force(impl, interpret=False))
        yield


def _step(fw: graphs.Graph, bw: graphs.Graph, model: torch.nn.Module, mesh: spmd.Mesh):
    """The step function over (inputs, first moments, second moments, key), its abstract
    arguments, the output shardings and the donated arguments."""
    if fw.sources is None:
        raise RuntimeError("the forward graph's inputs could not be matched to the model")
    params = {id(p) for p in model.parameters() if p.requires_grad}
    replicated = mesh.sharding(())
    inputs = [_placed(s._tpu_storage.array, replicated) for s in fw.sources]
    trained = [i for i, s in enumerate(fw.sources) if id(s) in params]
    f32 = [jax.ShapeDtypeStruct(inputs[i].shape, jnp.float32, sharding=inputs[i].sharding)
           for i in trained]
    key = jax.ShapeDtypeStruct((3,), jnp.uint32, sharding=replicated)
    fw_statics = _statics(fw.example_inputs, fw.program)

    others = [i for i in range(len(inputs)) if i not in set(trained)]

    def step(params, rest, m, v, key):
        arrays = [None] * len(inputs)
        for i, a in zip(trained, params):
            arrays[i] = a
        for i, a in zip(others, rest):
            arrays[i] = a
        loss, saved = _forward(fw.program, fw_statics, key, arrays)
        grads = _backward(bw, key, saved, loss)
        new = [_adamw(arrays[i], grads[i], m[k], v[k]) for k, i in enumerate(trained)]
        return [n[0] for n in new], [n[1] for n in new], [n[2] for n in new], loss

    out = ([inputs[i].sharding for i in trained], [s.sharding for s in f32],
           [s.sharding for s in f32], replicated)
    args = ([inputs[i] for i in trained], [inputs[i] for i in others], f32, f32, key)
    return step, args, out, (0, 2, 3)


def _placed(a: jax.ShapeDtypeStruct, default: jax.sharding.Sharding) -> jax.ShapeDtypeStruct:
    """An abstract input on the mesh: as placed, else (buffers) replicated."""
    if isinstance(getattr(a, "sharding", None), jax.sharding.NamedSharding):
        return a
    return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=default)


def _statics(example_inputs, program: GraphProgram) -> tuple:
    return (settings(),
            tuple(_static(a) for a, t in zip(example_inputs, program.is_tensor) if not t),
            tuple(shadow.geometry(a) for a, t in zip(example_inputs, program.is_tensor) if t))


def _outputs(program: GraphProgram, statics: tuple, key, arrays) -> list[Any]:
    """Trace ``program`` on ``arrays``; each output as (storage array, geometry) or a value."""
    storages, _ = program._trace(statics, key, *arrays)
    _, layout = program._layouts[statics]
    out = []
    for entry in layout:
        if entry[0] == "value":
            out.append(entry[1])
        else:
            kind, where, geometry = entry[:3]
            if kind == "whole":      # all of a new storage: (size, strides, dtype, bytes)
                geometry = (geometry[0], geometry[1], 0, geometry[2])
            out.append((arrays[where] if kind == "input" else storages[where], geometry))
    return out


def _forward(program: GraphProgram, statics: tuple, key, arrays):
    out = _outputs(program, statics, key, arrays)
    return _value(out[0]), out[1:]


def _backward(bw: graphs.Graph, key, saved: list, loss) -> list:
    """The backward graph on the forward's saved tensors and d(loss) = 1: a gradient (or
    None) per forward input."""
    tangent = (jnp.ones(loss.shape, loss.dtype), shadow.geometry(bw.example_inputs[-1]))
    pairs = [*saved, tangent]
    scalars = tuple(_static(a) for a, t in zip(bw.example_inputs, bw.program.is_tensor) if not t)
    statics = (settings(), scalars, tuple(g for _, g in pairs))
    return [None if o is None else _value(o) for o in
            _outputs(bw.program, statics, key, [a for a, _ in pairs])]


def _value(entry) -> jax.Array:
    """The tensor an output (storage array, geometry) stands for."""
    array, (size, stride, offset, dtype) = entry
    if tuple(array.shape) == tuple(size) and offset == 0 and \
            tuple(stride) == strided.contiguous_strides(tuple(size)):
        return array
    return read_view(Storage(array), tuple(size), tuple(stride), offset, dtype)


def _adamw(p, g, m, v):
    """One AdamW update (step 1 of bias correction is omitted: a constant scale)."""
    c = _ADAMW
    g32 = g.astype(jnp.float32)
    m = c["b1"] * m + (1 - c["b1"]) * g32
    v = c["b2"] * v + (1 - c["b2"]) * g32 * g32
    p32 = p.astype(jnp.float32) * (1 - c["lr"] * c["weight_decay"])
    p32 = p32 - c["lr"] * m / (jnp.sqrt(v) + c["eps"])
    return p32.astype(p.dtype), m, v
