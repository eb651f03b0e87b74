"""One training step of a model compiled for a chip: the ``torch.compile(backend="tpu")``
forward and backward graphs and the AdamW step, with the compiler's figures.

The model is built on the meta device and moved to abstract tpu tensors (no weights are
made, whatever its size); ``graphs.capture`` takes its forward and backward graphs as the
``tpu`` backend would, and each is lowered through its ``GraphProgram`` for the chip. The
optimizer step is what ``torch.optim.AdamW(fused=True)`` runs on tpu: one
``aten._fused_adamw_`` over every parameter, by the impl the registry picks for the chip
(the Pallas fused AdamW kernel), with parameters and states updated in place.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import jax
import torch

from tpu_kernels.aot import graphs, topology
from tpu_kernels.aot.compiler import Compiled, compile, compile_lowered, explain
from tpu_kernels.aot.configs import BUNDLED, ModelSpec, model_flops_per_token
from tpu_kernels.aot.summary import Summary
from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry import REGISTRY
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.registry.kinds import KERNEL_KINDS

_ADAMW = dict(lr=1e-4, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8, amsgrad=False,
              maximize=False)


@dataclasses.dataclass
class StepReport:
    """A training step on one chip: each program's figures and what they add up to."""
    model: str
    chip: str
    params: int
    tokens: int
    model_flops: float                      # per step (forward + backward)
    programs: list[tuple[str, Summary]]     # ("forward" | "backward" | "optimizer", ...)
    failures: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (kind, why)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def step_seconds(self) -> float | None:
        """XLA's roofline estimate of the step: the programs' estimates added up."""
        return None if self.failures else sum(s.optimal_seconds for _, s in self.programs)

    @property
    def peak_hbm_bytes(self) -> int | None:
        """The largest program's HBM (its arguments hold what the others keep alive)."""
        return max(s.hbm_bytes for _, s in self.programs) if self.programs else None

    @property
    def mfu(self) -> float | None:
        """Model FLOPs / (estimated step time x the chip's peak bf16 FLOP/s)."""
        peak = tpu_info.chip(self.chip).bf16_flops
        t = self.step_seconds
        return self.model_flops / (t * peak) if t else None

    def format(self) -> str:
        gib, mib = 1 / tpu_info.GiB, 1 / tpu_info.MiB
        row = tpu_info.chip(self.chip)
        lines = [f"{self.model} on {self.chip}: {self.params / 1e6:,.1f} M parameters, "
                 f"{self.tokens} tokens per step"]
        for kind, s in self.programs:
            names = sorted({k.name for k in s.kernels})
            lines.append(
                f"  {kind:9s} HBM args {s.argument_bytes * mib:10,.1f} MiB  out "
                f"{s.output_bytes * mib:10,.1f} MiB  temp {s.temp_bytes * mib:10,.1f} MiB  "
                f"est {s.optimal_seconds * 1e3:9.3f} ms  compile {s.compile_seconds:5.1f} s  "
                f"{len(s.kernels)} Mosaic kernels: {', '.join(names) or '-'}")
        for kind, why in self.failures:
            lines.append(f"  {kind:9s} does not compile: {why}")
        if self.failures:
            lines.append(f"  step: does not fit one {self.chip} ({row.hbm_bytes * gib:.0f} GiB)"
                         if any(why.startswith("HBM") for _, why in self.failures)
                         else "  step: does not compile")
            return "\n".join(lines)
        loops = sum(s.loops for _, s in self.programs)
        unknown = sorted({c for _, s in self.programs for c in s.unknown_calls})
        note = (" (a lower bound: loops)" if loops else "") + (
            f" (uncertain: custom calls {', '.join(unknown)})" if unknown else "")
        lines.append(f"  step: peak HBM {self.peak_hbm_bytes * gib:.2f} GiB of "
                     f"{row.hbm_bytes * gib:.0f} GiB; XLA's estimate {self.step_seconds * 1e3:.3f} "
                     f"ms{note}; {self.model_flops:.3g} model FLOPs -> MFU {self.mfu:.1%} of "
                     f"{row.bf16_flops / 1e12:.0f} TFLOP/s")
        return "\n".join(lines)


def build(spec: ModelSpec) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model on abstract tpu tensors, in training mode, and an abstract token batch."""
    with torch.device("meta"):
        model = spec.build()
    graphs.to_abstract(model).train()
    tokens = graphs.abstract((spec.batch, spec.seq + spec.extra_tokens), torch.int64)
    return model, tokens


def compile_step(spec: ModelSpec, chip: str, model: torch.nn.Module | None = None,
                 tokens: torch.Tensor | None = None,
                 captured: list[graphs.Graph] | None = None) -> StepReport:
    """Compile ``spec``'s forward, backward and optimizer step for ``chip``. ``model``,
    ``tokens`` and ``captured`` (from an earlier chip) are reused when given."""
    if model is None or tokens is None:
        model, tokens = build(spec)
    with tpu_info.compile_for(chip):    # the graphs pick the kernels the chip runs
        captured = captured or graphs.capture(spec.loss, model, tokens)
    sharding = topology.sharding(chip)
    jobs = [(g.kind, lambda g=g: compile_lowered(lambda: graphs.lower(g, sharding), chip))
            for g in captured]
    jobs.append(("optimizer", lambda: optimizer_step(model, chip)))
    programs, failures = [], []
    for kind, job in jobs:
        try:
            programs.append((kind, job().summary))
        except Exception as exc:  # noqa: BLE001  (a compiler verdict, e.g. HBM exhausted)
            failures.append((kind, explain(exc)))
    n_tokens = spec.batch * spec.seq
    return StepReport(spec.name, tpu_info.chip(chip).name,
                      sum(p.numel() for p in model.parameters()), n_tokens,
                      model_flops_per_token(spec, model) * n_tokens, programs, failures)


def kernels_used(captured: list[graphs.Graph], chip: str) -> dict[str, dict[str, str]]:
    """Per captured graph ("forward", "backward", "inference"), the ops a Pallas or Helion
    kernel runs when the graph is lowered for ``chip``: op name -> impl kind (lowering
    traces the graph, and each op's route is asked as it would be on that chip)."""
    sharding = topology.sharding(chip)
    used = {}
    with tpu_info.compile_for(chip):
        for g in captured:
            graphs.lower(g, sharding)
            used[g.kind] = {op: kind for op, kind in sorted(g.program.impls) if kind in KERNEL_KINDS}
    return used


def optimizer_step(model: torch.nn.Module, chip: str) -> Compiled:
    """``aten._fused_adamw_`` over the model's trainable parameters (states in the
    parameters' dtype, as torch makes them), by the impl the registry picks for ``chip``."""
    params = [p for p in model.parameters() if p.requires_grad]
    metas = [torch.empty(p.shape, dtype=p.dtype, device="meta") for p in params]
    steps = [torch.empty((), dtype=torch.float32, device="meta") for _ in params]
    op = torch.ops.aten._fused_adamw_.default
    with tpu_info.compile_for(chip):
        impl, skipped = REGISTRY.resolve(op, (metas, metas, metas, metas, [], steps), _ADAMW)
    if impl is None:
        raise RuntimeError(f"no impl runs {op} for these parameters: {skipped}")

    def step(p, g, m, v, s):
        return impl.fn(p, g, m, v, [], s, **_ADAMW)

    specs = [jax.ShapeDtypeStruct(tuple(p.shape), to_jax_dtype(p.dtype)) for p in params]
    scalars = [jax.ShapeDtypeStruct((), jax.numpy.float32) for _ in params]
    return compile(step, specs, specs, specs, specs, scalars, chip=chip,
                   donate_argnums=(0, 2, 3))


def compile_model(spec: ModelSpec, chips: list[str]) -> list[StepReport]:
    """``compile_step`` for each chip (the model is built and its graphs captured once)."""
    model, tokens = build(spec)
    with tpu_info.compile_for(chips[0]):
        captured = graphs.capture(spec.loss, model, tokens)
    return [compile_step(spec, c, model, tokens, captured) for c in chips]


def load(target: str) -> ModelSpec:
    """``MODULE:FACTORY`` (or a bundled name: gpt, llama-small, qwen3-moe-small,
    llama3-8b) -> the factory's ModelSpec."""
    if target in BUNDLED:
        return BUNDLED[target]()
    module, _, factory = target.partition(":")
    if not factory:
        raise ValueError(f"--model takes MODULE:FACTORY or one of {sorted(BUNDLED)}, "
                         f"not {target!r}")
    spec: Any = getattr(importlib.import_module(module), factory)()
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"{target}() returned {type(spec).__name__}; it must return a "
                        "tpu_kernels.aot.configs.ModelSpec")
    return spec
