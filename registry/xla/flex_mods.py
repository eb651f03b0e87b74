"""FlexAttention's ``score_mod`` and ``mask_mod`` as JAX functions, through the XLA lowerings.

A mod is a torch function of one attention entry: ``score_mod(score, b, h, q_idx, kv_idx,
*captured)`` and ``mask_mod(b, h, q_idx, kv_idx, *captured)``, each index a 0-d int32
tensor (torch vmaps them over the score matrix). ``lower`` traces it with ``make_fx`` on
0-d meta tensors into an ATen graph, and ``Mod`` evaluates that graph node by node with
the registry's XLA lowerings on per-entry JAX values, so ``jax.vmap`` spreads it over a
score tile (inside a Pallas kernel) or over the whole score matrix (the dense fallback).

Captured tensors are read in one of two ways. ``dense`` gathers them as written (any
index expression: XLA gathers). ``gathered`` replaces each read of the form
``buf[i0, i1, ...]``, every ``i`` one of b, h, q_idx, kv_idx (or a 0-d ``buf`` used
whole), by a value the caller fetched as a block: the way a TPU kernel reads them, since
vector code cannot gather. ``Mod.refusal`` says why a graph cannot be read that way.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tpu_kernels.registry.context import Call, OutMeta, lowering
from tpu_kernels.registry.core import REGISTRY
from tpu_kernels.registry.dtypes import to_jax_dtype

SCORE_INDEX = ("b", "h", "q", "kv")      # the index arguments after ``score``
_NUMBER = (bool, int, float)
_aten = torch.ops.aten
_META_ONLY = {_aten.new_ones.default, _aten.new_zeros.default, _aten.new_full.default,
              _aten.new_empty.default}   # ops that read only their input's dtype/device


@dataclasses.dataclass(frozen=True)
class Access:
    """One read of a captured tensor: ``buf[dims...]``, dims named from b/h/q/kv."""
    buf: int                  # position among the mod's captured tensors
    dims: tuple[str, ...]     # the index used by each of the tensor's dims ('': 0-d, whole)


@dataclasses.dataclass(eq=False)
class Mod:
    """A traced score_mod (``n_lead`` = 5 inputs before the captured tensors) or
    mask_mod (``n_lead`` = 4). Compared by identity: one object per traced function."""
    gm: torch.fx.GraphModule
    n_lead: int
    metas: dict                               # node -> meta value (0-d tensors)
    accesses: tuple[Access, ...]
    access_of: dict                           # node -> index into accesses
    refusal: str | None                       # why ``gathered`` cannot run it
    is_identity: bool                         # score_mod returns score unchanged
    is_true: bool                             # mask_mod keeps every entry

    def dense(self, *args: Any) -> jax.Array:
        """The mod on per-entry values: (score,) b, h, q, kv, *captured (whole tensors)."""
        return _evaluate(self, args, {})

    def gathered(self, lead: Sequence[Any], values: Sequence[Any]) -> jax.Array:
        """The mod with each captured-tensor read replaced by ``values[access]``."""
        if self.refusal:
            raise ValueError(f"flex_attention: {self.refusal}")
        phs = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        args = list(lead) + [None] * (len(phs) - self.n_lead)
        replace = {node: values[i] for node, i in self.access_of.items()}
        return _evaluate(self, args, replace)


def lower(fn: Callable, kind: str, captured: Sequence[Any],
          score_dtype: torch.dtype = torch.float32) -> Mod:
    """Trace ``fn`` (kind 'score' or 'mask') with captured values: a (shape, torch dtype)
    pair per tensor, a Python number as itself (baked into the graph)."""
    return _lower(fn, kind, tuple(captured), score_dtype)


@functools.lru_cache(maxsize=256)
def _lower(fn, kind, captured, score_dtype) -> Mod:
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):   # no memory; .to(device) is metadata
        idx = [torch.empty((), dtype=torch.int32) for _ in SCORE_INDEX]
        lead = ([torch.empty((), dtype=score_dtype)] if kind == "score" else []) + idx
        bufs = [torch.empty(c[0], dtype=c[1]) if isinstance(c, tuple) else c for c in captured]
    try:
        with TransformGetItemToIndex():
            gm = make_fx(fn, tracing_mode="fake")(*lead, *bufs)
    except Exception as exc:
        raise NotImplementedError(
            f"flex_attention on tpu: cannot trace the {kind}_mod {getattr(fn, '__name__', fn)} "
            f"on 0-d int32 indices: {type(exc).__name__}: {exc}. A {kind}_mod must be built "
            f"from tensor ops on its arguments (no .item(), no Python control flow on values)") from exc
    metas = _metas(gm, lead + bufs)
    accesses, access_of, refusal = _analyse(gm, len(lead), bufs, metas)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    mod = Mod(gm, len(lead), metas, tuple(accesses), access_of, refusal,
              is_identity=kind == "score" and _output(gm) is phs[0], is_true=False)
    if kind == "mask" and all(u.target in _META_ONLY for n in phs for u in n.users):
        # reads no values (torch's noop_mask: b.new_ones(())): evaluate it once
        zero = jnp.zeros((), jnp.int32)
        mod.is_true = bool(np.all(np.asarray(mod.dense(*[zero] * len(phs)))))
    return mod


# -- analysis ------------------------------------------------------------------------------
def _output(gm):
    out = gm.graph.output_node().args[0]
    return out[0] if isinstance(out, (tuple, list)) and len(out) == 1 else out


def _metas(gm, inputs) -> dict:
    """Each node's fake value (shape, dtype), as make_fx recorded it."""
    phs = iter(inputs)
    return {n: (next(phs) if n.op == "placeholder" else n.meta.get("val"))
            for n in gm.graph.nodes if n.op != "output"}


def _analyse(gm, n_lead: int, bufs, metas):
    """The captured-tensor reads, and why a kernel cannot take the graph (None: it can)."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = {phs[n_lead - 4 + i]: d for i, d in enumerate(SCORE_INDEX)}
    buf_pos = {n: i for i, n in enumerate(phs[n_lead:])}
    accesses: list[Access] = []
    access_of: dict = {}
    refusal = None
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node.op == "output":
            continue
        if node.op == "get_attr":
            continue
        val = metas.get(node)
        is_index = node.target is _aten.index.Tensor
        if isinstance(val, torch.Tensor) and val.dim() != 0 and not is_index:
            refusal = refusal or (f"{node.target} makes a {val.dim()}-d value "
                                  f"(only per-entry math tiles)")
        read = is_index and node.args[0] in buf_pos
        if read:
            base, index = node.args[0], node.args[1]
            dims = tuple(names.get(i) for i in index)
            ok = (None not in dims and len(set(dims)) == len(dims)
                  and len(dims) == bufs[buf_pos[base]].dim())
            if ok:
                access_of[node] = _add(accesses, Access(buf_pos[base], dims))
                continue
            refusal = refusal or (
                f"captured tensor #{buf_pos[base]} is indexed by computed values "
                f"(only buf[b|h|q_idx|kv_idx, ...], one index per dim, can be read by blocks)")
        for a in _flat_args(node):
            if a in buf_pos and bufs[buf_pos[a]].dim() == 0:
                access_of.setdefault(a, _add(accesses, Access(buf_pos[a], ())))
            elif a in buf_pos and not read:
                refusal = refusal or (f"captured tensor #{buf_pos[a]} is used whole by {node.target} "
                                      f"(only reads buf[b|h|q_idx|kv_idx, ...] are supported)")
    return accesses, access_of, refusal


def _add(accesses: list, a: Access) -> int:
    if a not in accesses:
        accesses.append(a)
    return accesses.index(a)


def _flat_args(node) -> list:
    out: list = []
    torch.fx.node.map_arg((node.args, node.kwargs), out.append)
    return out


# -- evaluation ----------------------------------------------------------------------------
def _evaluate(mod: Mod, args: Sequence[Any], replace: dict) -> jax.Array:
    env: dict = {}
    it = iter(args)
    for node in mod.gm.graph.nodes:
        if node in replace:
            if node.op == "placeholder":
                next(it)
            # 32-bit inside kernels (x64 off there): canonicalize, e.g. int64 -> int32
            dt = jax.dtypes.canonicalize_dtype(to_jax_dtype(mod.metas[node].dtype))
            env[node] = replace[node].astype(dt)
        elif node.op == "placeholder":
            env[node] = next(it)
        elif node.op == "get_attr":
            env[node] = _constant(getattr(mod.gm, node.target))
        elif node.op == "call_function":
            env[node] = _call(node, env, mod.metas)
        elif node.op == "output":
            out = node.args[0]
            out = out[0] if isinstance(out, (tuple, list)) else out
            return env[out] if isinstance(out, torch.fx.Node) else jnp.asarray(out)
    raise AssertionError("graph without output")


def _meta(v):
    """A fake value as a meta tensor (what the lowerings' ``supports`` predicates see)."""
    if isinstance(v, torch.Tensor):
        return torch.empty(v.shape, dtype=v.dtype, device="meta")
    return v


def _constant(t: torch.Tensor) -> jax.Array:
    if t.device.type == "meta":
        raise NotImplementedError("flex_attention: a mod's tensor constant has no value (meta)")
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.float().numpy(), jnp.bfloat16)
    return jnp.asarray(t.numpy())


def _call(node, env: dict, metas: dict) -> Any:
    target = node.target
    if target is operator.getitem:
        return env[node.args[0]][node.args[1]]
    if not isinstance(target, torch._ops.OpOverload):
        raise NotImplementedError(f"flex_attention: a mod calls {target}, which has no tpu lowering")
    if target in _VALUE_IDENTITY:
        return env[node.args[0]]
    target = _copy_variant(target) if target.is_view else target
    margs, mkw = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _meta(metas[n]))
    impl = _xla_impl(target, margs, mkw)
    schema = {a.name: str(a.type) for a in target._schema.arguments}
    names = [a.name for a in target._schema.arguments]

    def conv(v, name):
        if isinstance(v, torch.fx.Node):
            return env[v]
        if isinstance(v, (list, tuple)):
            return type(v)(conv(x, name) for x in v)
        traced = type(v) in _NUMBER and name not in impl.static and (
            "Tensor" in schema.get(name, "") or "number" in schema.get(name, "")
            or "float" == schema.get(name, ""))
        return jnp.asarray(v) if traced else v

    args = [conv(v, names[i]) for i, v in enumerate(node.args)]
    kwargs = {k: conv(v, k) for k, v in node.kwargs.items()}
    val = metas[node]
    vals = val if isinstance(val, (tuple, list)) else (val,)
    outs = tuple(OutMeta(tuple(m.shape), m.dtype) if isinstance(m, torch.Tensor) else None
                 for m in vals)
    with lowering(Call(outs)):   # device-side checks of the lowering are not raised here
        result = impl.fn(*args, **kwargs)
    if isinstance(val, torch.Tensor):
        result = result[0] if isinstance(result, (list, tuple)) else result
        return result.astype(to_jax_dtype(val.dtype))
    return result


_VALUE_IDENTITY = {_aten.detach.default, _aten.alias.default, _aten.lift_fresh.default}


def _copy_variant(op):
    """A view op's functional twin (``view`` -> ``view_copy``), which the lowerings cover."""
    packet = getattr(_aten, op._schema.name.split("::")[1] + "_copy", None)
    return getattr(packet, op._overloadname, op) if packet is not None else op


def _xla_impl(op, margs, mkw):
    for impl in REGISTRY.impls(op):
        if impl.kind == "xla" and not impl.data_dependent and impl.check(*margs, **mkw) is None:
            return impl
    raise NotImplementedError(f"flex_attention: a mod uses {op}, which has no XLA lowering")
