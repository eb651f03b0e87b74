"""torch's optimizers and ``clip_grad_norm_`` take their foreach paths for tpu tensors;
Adam, AdamW and SGD with momentum their fused step.

torch picks an optimizer's implementation by the parameters' type and device: the
foreach path (one ``torch._foreach_*`` op per update step over all parameters) when every
parameter is a plain ``Tensor`` or ``Parameter`` on a device that has foreach kernels
(``tpu`` is listed), else one op per parameter per step. A tpu tensor is a ``Tensor``
subclass, so without this AdamW on tpu ran the per-parameter loop: 292 ops a step for the
small GPT's 29 parameters, against 10 foreach ops (each one program over all of them).
Registering the type gives the choice torch makes for CUDA tensors; ``foreach=False``
still picks the loop.

And a compiled ``opt.step`` counts its steps on the device, as torch.compile arranges for
CUDA: Dynamo sets a param group's ``capturable`` when its parameters are all CUDA (or XPU)
tensors with no state yet, so the step counters are made on the device and the compiled
step reads no CPU scalars. Its rule does not know tpu tensors; ``_set_capturable`` below
applies it to them before Dynamo's own runs. (Compiled small-GPT AdamW step, interleaved
A/B on 2 CPU cores: 1.72 ms with device counters vs 1.99 ms with CPU ones; on a TPU v5e
about 5% of the step.)

Adam and AdamW go one step further: given neither ``fused`` nor ``foreach``, a group of
floating-point tpu parameters takes the fused step (``torch._fused_adamw_``: one program
over all parameters and moments, plus the step counters' increment) from its first eager
step, where torch would take foreach for CUDA (it keeps fused opt-in for "bake-in time").
Each foreach op is a program of its own, and a launch is what costs on a TPU host (~120 us
of host work, more after Python: ``bench/results/tpu_v5e/2026-12-06-s35.md``): the foreach
AdamW step is ~10 of them. The small GPT with a compiled loss and an eager AdamW, steps
interleaved in one process: on a TPU v5e 19.3 ms foreach, 6.4 fused (a compiled
``opt.step``: 3.9; the eager ``opt.step()`` alone 15.7 vs 3.6 ms); on 2 CPU cores 7.57,
5.22 and 4.75 ms.
SGD with momentum or weight decay does the same (its foreach step is 3-4 ops, fused one;
the small GPT's loop with momentum 0.9 on a TPU v5e: 5.27 ms foreach, 4.70 fused; on 2 CPU
cores 3.53 and 3.11); plain SGD is one ``_foreach_add_`` already (3.75 ms foreach, 3.88
fused on the chip) and keeps it. Adagrad is left to torch: it makes its state at
construction, on a device and in a dtype that depend on ``fused``, so its first step is
too late to choose.
The fused step itself runs as a program that donates what it writes
(``fused_step_programs.py``), so it holds one copy of parameters and state; run as a plain
op (``TPU_KERNELS_FUSED_STEP_PROGRAMS=0``) its new values are all made before the old ones
go, one parameter set above foreach's peak. ``foreach=True``
or ``fused=False`` keeps torch's choice; a group with state already (a loaded
``state_dict``, an earlier step) or whose first step is compiled keeps its path.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.optim.optimizer import _foreach_supported_types as _OPTIMIZERS, register_optimizer_step_pre_hook
from torch.utils._foreach_utils import _foreach_supported_types as _UTILITIES

from tpu_kernels.tensor import TpuTensor

# torch's lists of the tensor types its foreach paths take (optimizers; clip_grad_norm_
# and the other utilities of torch.utils._foreach_utils), mutated in place
_LISTS = (_OPTIMIZERS, _UTILITIES)


# the optimizers whose unset ``fused`` means fused on tpu, and for which of their groups
# (exact types: a subclass may read its group's flags its own way). Plain SGD (no momentum,
# no weight decay) is one foreach op already, and the fused op is no faster there.
_FUSED_BY_DEFAULT: dict[type, Callable[[dict], bool]] = {
    torch.optim.Adam: lambda group: True,
    torch.optim.AdamW: lambda group: True,
    torch.optim.SGD: lambda group: group["momentum"] != 0 or group["weight_decay"] != 0,
}
_hook: Any = None


def install() -> None:
    """Idempotent: list the tpu tensor type where torch looks for foreach-capable types,
    and let Adam and AdamW take their fused step on tpu parameters (see above)."""
    global _hook
    for types in _LISTS:
        if TpuTensor not in types:
            types.append(TpuTensor)
    if _hook is None:
        _hook = register_optimizer_step_pre_hook(_fused_when_unset)


def _fused_when_unset(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """A global step pre-hook: an Adam/AdamW group (an SGD group with momentum or weight
    decay) of floating-point tpu parameters with dense gradients, neither ``fused`` nor
    ``foreach`` set and no state yet is made ``fused`` (as ``fused=True`` at construction
    would have). Not while compiling: a compiled step keeps the path it was traced with."""
    wants = _FUSED_BY_DEFAULT.get(type(opt))
    if wants is None or torch.compiler.is_compiling():
        return None
    for group in opt.param_groups:
        params = group["params"]
        if (group.get("fused") is None and group.get("foreach") is None and not group.get("differentiable")
                and wants(group) and _unstarted_tpu_group(opt, params)
                and all(p.is_floating_point() and (p.grad is None or not p.grad.is_sparse) for p in params)):
            group["fused"] = True
            opt._step_supports_amp_scaling = True   # what their __init__ sets for fused=True
    return None


def _unstarted_tpu_group(opt: torch.optim.Optimizer, params: list) -> bool:
    """A param group's ``params`` are tpu tensors (one at least) with no optimizer state
    yet: its first step may still choose where its state lives and which path it takes."""
    return bool(params) and all(type(p) is TpuTensor for p in params) and not any(p in opt.state for p in params)


def install_compiled() -> None:
    """Idempotent: compiled optimizer steps over tpu parameters are capturable (see above).
    Called when the tpu backend loads (``compile_backend``): ``import tpu_kernels`` leaves
    Dynamo unloaded."""
    from torch._dynamo.variables.optimizer import OptimizerVariable
    if not getattr(OptimizerVariable._set_capturable, "_tpu", False):
        OptimizerVariable._set_capturable = _set_capturable(OptimizerVariable._set_capturable)


def _set_capturable(dynamo_rule: Any) -> Any:
    """Dynamo's ``OptimizerVariable._set_capturable`` preceded by its rule for tpu groups."""
    def set_capturable(self: Any, tx: Any) -> None:
        optimizer: torch.optim.Optimizer = self.value
        for group in optimizer.param_groups:
            if "capturable" in group and _unstarted_tpu_group(optimizer, group.get("params", [])):
                group["capturable"] = True
        dynamo_rule(self, tx)
    set_capturable._tpu = True
    return set_capturable
