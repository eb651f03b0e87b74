"""Single-controller SPMD: one program over a mesh of devices, tpu tensors annotated with
shardings, and XLA's partitioner inserting the collectives (as torch_xla's SPMD).

    from tpu_kernels import spmd
    mesh = spmd.Mesh((2, 4), ("fsdp", "tp"))          # over the local JAX devices
    spmd.mark_sharding(w, mesh, ("fsdp", "tp"))       # w's jax array becomes a NamedSharding one
    spmd.local_shapes(w)                              # [(rows / 2, cols / 4)] * 8
    spmd.fsdp(model, mesh, axis="fsdp")               # every parameter sharded in place

A sharded tpu tensor is one global tensor. Eager ops on it are jitted programs, which JAX
compiles for the shardings of their inputs (its executable cache keys on them), so they
run as SPMD programs; ``torch.compile(backend="tpu")`` and deferred mode compile whole
sharded programs the same way. A storage keeps its placement: an in-place write into a
sharded storage (an optimizer step, a ``copy_``) is laid out as the storage was, so
parameters stay sharded; after each optimizer step, states shaped as their parameter
(AdamW's moments) are laid out as it is (a ``torch.optim`` step hook), so they follow.
torch's ``DeviceMesh``/DTensor assume one process per device (``tpu_kernels.distributed``);
this module is the one-process way.
"""
from __future__ import annotations

import fnmatch
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import numpy as np
import torch
from jax.sharding import NamedSharding, PartitionSpec
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from tpu_kernels import inflight
from tpu_kernels.storage import place
from tpu_kernels.tensor import TpuTensor, wrap
from tpu_kernels.tensor_values import value
Spec = Sequence[str | tuple[str, ...] | None]


class Mesh:
    """A logical mesh of devices with named axes: ``Mesh((2, 4), ("fsdp", "tp"))``.
    ``devices`` defaults to the first ``prod(shape)`` of ``jax.devices()``."""

    def __init__(self, shape: Sequence[int], axis_names: Sequence[str],
                 devices: Sequence[jax.Device] | None = None) -> None:
        shape, axis_names = tuple(shape), tuple(axis_names)
        if len(shape) != len(axis_names):
            raise ValueError(f"Mesh: shape {shape} and axis_names {axis_names} differ in length")
        devices = list(jax.devices() if devices is None else devices)
        n = math.prod(shape)
        if len(devices) < n:
            raise ValueError(
                f"Mesh{shape} needs {n} devices, JAX has {len(devices)}; on a CPU host set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before jax starts")
        self.jax = jax.sharding.Mesh(np.array(devices[:n]).reshape(shape), axis_names)
        inflight.watch(devices[:n])

    @property
    def shape(self) -> dict[str, int]:
        return dict(self.jax.shape)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(self.jax.axis_names)

    def size(self, axis: str | tuple[str, ...] | None) -> int:
        """The number of shards along ``axis`` (a name, a tuple of names, or None: 1)."""
        if axis is None:
            return 1
        names = (axis,) if isinstance(axis, str) else axis
        return math.prod(self.jax.shape[a] for a in names)

    def sharding(self, spec: Spec) -> NamedSharding:
        return NamedSharding(self.jax, PartitionSpec(*spec))

    def __repr__(self) -> str:
        return f"spmd.Mesh({self.shape})"


def _check(t: torch.Tensor, mesh: Mesh, spec: Spec, what: str) -> None:
    if not isinstance(t, TpuTensor) or t._tpu_storage is None:
        raise TypeError(f"{what}: expected a tpu tensor, got a {t.device} {type(t).__name__}")
    if not t._tpu_direct:
        raise ValueError(f"{what}: the tensor (shape {tuple(t.shape)}) is a view into a larger "
                         "storage; shard its base tensor, or a .contiguous() copy")
    if len(spec) != t.dim():
        raise ValueError(f"{what}: spec {tuple(spec)} names {len(spec)} dims, the tensor "
                         f"(shape {tuple(t.shape)}, {t.dtype}) has {t.dim()}")
    for name in (a for s in spec if s is not None for a in ((s,) if isinstance(s, str) else s)):
        if name not in mesh.shape:
            raise ValueError(f"{what}: axis {name!r} is not in the mesh's axes {mesh.axis_names}")


def mark_sharding(t: torch.Tensor, mesh: Mesh, spec: Spec) -> torch.Tensor:
    """Lay ``t``'s array out over ``mesh``: dim i split along the mesh axis ``spec[i]``
    (None replicates it; a dim need not divide evenly). In place; returns ``t``."""
    _check(t, mesh, spec, "spmd.mark_sharding")
    _placed(t._tpu_storage, mesh.sharding(spec))   # a new version: cached views re-read
    return t


def sharding(t: torch.Tensor) -> jax.sharding.Sharding:
    """The sharding of ``t``'s array."""
    return value(t).sharding


def spec_of(t: torch.Tensor) -> tuple:
    """``t``'s partition spec, one entry per dim (all None when it is not a NamedSharding)."""
    s = sharding(t)
    spec = tuple(s.spec) if isinstance(s, NamedSharding) else ()
    return spec + (None,) * (t.dim() - len(spec))


def local_shapes(t: torch.Tensor) -> list[tuple[int, ...]]:
    """The shape of the shard each device holds, in device order."""
    shards = sorted(value(t).addressable_shards, key=lambda s: s.device.id)
    return [tuple(s.data.shape) for s in shards]


def _follow_parameters(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """After an optimizer step: lay each state tensor shaped as its parameter out as the
    parameter is (once: the state's storage keeps it from then on)."""
    for p, state in opt.state.items():
        placement = getattr(getattr(p, "_tpu_storage", None), "placement", None)
        if placement is None:
            continue
        for v in state.values():
            if isinstance(v, TpuTensor) and v._tpu_direct and v.shape == p.shape and \
                    v._tpu_storage.placement != placement:
                place(v._tpu_storage, placement)


_HOOK: list = []


def _placed(st, sharding: jax.sharding.Sharding) -> None:
    """``place`` a parameter's storage; optimizer states will follow (the hook, once)."""
    if not _HOOK:
        _HOOK.append(register_optimizer_step_post_hook(_follow_parameters))
    place(st, sharding)


def _params(module: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    return ((n, p) for n, p in module.named_parameters() if isinstance(p, TpuTensor))


def fsdp(module: nn.Module, mesh: Mesh, axis: str = "fsdp", min_size: int = 0) -> nn.Module:
    """Shard every parameter of ``module`` over ``axis`` in place (FSDP/ZeRO-3 style): its
    first dim that is not sharded yet and divides evenly. Composes with
    ``tensor_parallel`` (call that first). Parameters with fewer than ``min_size`` elements
    or no such dim stay replicated. Optimizer states made from the parameters follow."""
    n = mesh.size(axis)
    for _, p in _params(module):
        spec = list(spec_of(p))
        if p.numel() < min_size or axis in spec:
            continue
        dim = next((d for d, s in enumerate(spec) if s is None and p.shape[d] % n == 0), None)
        if dim is not None:
            spec[dim] = axis
            _placed(p._tpu_storage, mesh.sharding(spec))
    return module


_STYLES = {  # a Linear's (weight [out, in], bias [out]) specs per style, for axis "a"
    "colwise": lambda a: {"weight": (a, None), "bias": (a,)},
    "rowwise": lambda a: {"weight": (None, a), "bias": (None,)},
}


def tensor_parallel(module: nn.Module, mesh: Mesh, plan: Mapping[str, str | Mapping[str, Spec]],
                    axis: str = "tp") -> nn.Module:
    """Shard parameters of the submodules ``plan`` names (fnmatch patterns of module names)
    in place: "colwise" (a Linear's output features over ``axis``), "rowwise" (its input
    features), or a dict of parameter name -> spec (e.g. ``{"w1": ("ep", None, None)}``
    for experts stacked on dim 0)."""
    matched = set()
    for name, sub in module.named_modules():
        for pattern, style in plan.items():
            if not fnmatch.fnmatchcase(name, pattern):
                continue
            matched.add(pattern)
            if isinstance(style, str):
                if style not in _STYLES:
                    raise ValueError(f"spmd.tensor_parallel: style {style!r} for {name!r}: "
                                     f"expected one of {sorted(_STYLES)} or a dict of specs")
                specs = _STYLES[style](axis)
            else:
                specs = style
            for pname, spec in specs.items():
                p = getattr(sub, pname, None)
                if p is not None:
                    _check(p, mesh, spec, f"spmd.tensor_parallel({name}.{pname})")
                    _placed(p._tpu_storage, mesh.sharding(spec))
    missing = set(plan) - matched
    if missing:
        raise ValueError(f"spmd.tensor_parallel: no submodule matches {sorted(missing)}")
    return module


def shardings(module: nn.Module) -> dict[str, tuple]:
    """Parameter name -> its partition spec (for reports and tests)."""
    return {n: spec_of(p) for n, p in _params(module)}


def per_shard(fn: Callable[..., Any], mesh: Mesh, in_specs: Sequence[Spec],
              out_specs: Spec | Sequence[Spec]) -> Callable[..., Any]:
    """``fn`` (a function of jax arrays, e.g. a Pallas kernel) run on each device's shard
    (``jax.shard_map``): ``per_shard(fn, mesh, in_specs, out_specs)(*tpu_tensors)``. Each
    input is laid out as its spec says (a no-op when it already is), ``fn`` sees the
    per-device blocks, and the results are tpu tensors laid out by ``out_specs`` (one spec,
    or one per output). A kernel so run is not gathered: attention sharded over heads runs
    each device's heads where they are. ``fn`` must be correct per shard (no
    cross-shard terms: it may call ``jax.lax`` collectives over the mesh's axes)."""
    many = bool(out_specs) and not isinstance(out_specs[0], (str, type(None)))
    outs = tuple(PartitionSpec(*s) for s in out_specs) if many else PartitionSpec(*out_specs)
    mapped = jax.jit(jax.shard_map(fn, mesh=mesh.jax, check_vma=False, out_specs=outs,
                                   in_specs=tuple(PartitionSpec(*s) for s in in_specs)))

    def call(*tensors: torch.Tensor) -> Any:
        if len(tensors) != len(in_specs):
            raise TypeError(f"spmd.per_shard: {len(in_specs)} in_specs, {len(tensors)} inputs")
        arrays = []
        for t, spec in zip(tensors, in_specs):
            _check(t, mesh, spec, "spmd.per_shard")
            arrays.append(jax.device_put(value(t), mesh.sharding(spec)))
        out = inflight.track(mapped(*arrays))
        return tuple(wrap(a) for a in out) if many else wrap(out)
    call.program = mapped        # the jitted shard_map (to lower and inspect its HLO)
    return call
