"""torch's optimizers take their foreach path for tpu parameters by default, as for CUDA
ones, Adam, AdamW and SGD with momentum or weight decay their fused step
(``optim_defaults.py``), and match CPU; plain SGD keeps its one foreach op;
``foreach=False`` still takes the loop, ``foreach=True`` foreach; a compiled first step
keeps foreach; fused AdamW and SGD under a GradScaler match CPU; ``clip_grad_norm_`` and
``clip_grad_value_`` take their foreach ops."""
from __future__ import annotations

import collections
import contextlib
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tpu_kernels  # noqa: F401

OPTIMIZERS = {
    "SGD": lambda p, **kw: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01, **kw),
    "Adam": lambda p, **kw: torch.optim.Adam(p, lr=0.01, **kw),
    "AdamW": lambda p, **kw: torch.optim.AdamW(p, lr=0.01, **kw),
    "Adamax": lambda p, **kw: torch.optim.Adamax(p, lr=0.01, **kw),
    "Adadelta": lambda p, **kw: torch.optim.Adadelta(p, **kw),
    "Adagrad": lambda p, **kw: torch.optim.Adagrad(p, lr=0.01, **kw),
    "ASGD": lambda p, **kw: torch.optim.ASGD(p, lr=0.01, **kw),
    "NAdam": lambda p, **kw: torch.optim.NAdam(p, lr=0.01, **kw),
    "RAdam": lambda p, **kw: torch.optim.RAdam(p, lr=0.01, **kw),
    "RMSprop": lambda p, **kw: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, **kw),
    "Rprop": lambda p, **kw: torch.optim.Rprop(p, lr=0.01, **kw),
}


class _Ops(TorchDispatchMode):
    """Counts the ATen ops that run."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _model_and_input(device: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The small MLP every test here trains, and its batch (the same on every device)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(device)
    return model, torch.randn(4, 6).to(device)


def _train(opt_name: str, device: str, steps: int = 3, **kw):
    model, x = _model_and_input(device)
    opt = OPTIMIZERS[opt_name](model.parameters(), **kw)
    ops = _Ops()
    for k in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        if k == steps - 1:
            with ops:
                opt.step()
        else:
            opt.step()
    return model, ops.seen


# the ops a fused step runs: Adam's also counts its steps on the device (one foreach add)
FUSED = {"Adam": {"_fused_adam_", "_foreach_add_"}, "AdamW": {"_fused_adamw_", "_foreach_add_"},
         "SGD": {"_fused_sgd_"}}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_an_optimizer_takes_the_foreach_path_on_tpu_and_matches_cpu(name):
    cpu, _ = _train(name, "cpu")
    tpu, seen = _train(name, "tpu")
    if name in FUSED:     # one fused op (and Adam's step counters' increment)
        ops = {op for op in seen if not op.startswith("_record_function")}
        assert ops == FUSED[name] and all(seen[op] == 1 for op in ops), dict(seen)
    else:
        foreach_ops = sum(n for op, n in seen.items() if op.startswith("_foreach_"))
        assert foreach_ops > 0, f"{name} took the per-parameter loop: {dict(seen)}"
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kw", [{"foreach": True}, {"fused": False}], ids=["foreach", "fused_false"])
def test_adamw_told_its_path_keeps_it(kw):
    """``foreach=True`` takes foreach; ``fused=False`` alone is torch's per-parameter loop
    (torch picks foreach only when neither is given)."""
    cpu, _ = _train("AdamW", "cpu")
    tpu, seen = _train("AdamW", "tpu", **kw)
    assert not any(op.startswith("_fused") for op in seen), dict(seen)
    assert (seen["_foreach_lerp_"] == 1) == ("foreach" in kw), dict(seen)
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("first", ["eager", "compiled"])
def test_adamw_compiled_after_an_eager_or_compiled_first_step_matches_cpu(first):
    """A first eager step makes the group fused, and the compiled step then traces the fused
    op; a compiled first step keeps foreach (the hook does not run while compiling)."""
    torch._dynamo.reset()
    models = {}
    for device in ("cpu", "tpu"):
        model, x = _model_and_input(device)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        step = torch.compile(opt.step, backend="tpu" if device == "tpu" else "eager")
        for k in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            (opt.step if k == 0 and first == "eager" else step)()
        models[device] = (model, opt)
    (cpu, _), (tpu, opt) = models["cpu"], models["tpu"]
    assert opt.param_groups[0]["fused"] is (True if first == "eager" else None)
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=1e-4)


def test_plain_sgd_keeps_its_one_foreach_add():
    """SGD without momentum or weight decay is one ``_foreach_add_`` already: not fused."""
    models, ops = {}, _Ops()
    for device in ("cpu", "tpu"):
        model, x = _model_and_input(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).square().mean().backward()
        with ops if device == "tpu" else contextlib.nullcontext():
            opt.step()
        models[device] = model
    assert opt.param_groups[0]["fused"] is None
    assert {op for op in ops.seen if not op.startswith("_record_function")} == {"_foreach_add_"}, dict(ops.seen)
    for a, b in zip(models["cpu"].parameters(), models["tpu"].parameters()):
        torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=1e-4)


def test_foreach_false_still_takes_the_loop():
    cpu, _ = _train("AdamW", "cpu")
    tpu, seen = _train("AdamW", "tpu", foreach=False)
    assert not any(op.startswith("_foreach_") for op in seen)
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=1e-4)


def _with_large_grads():
    """A CPU Linear and its tpu copy, each with the same gradients, large enough to clip."""
    torch.manual_seed(0)
    cpu = torch.nn.Linear(6, 4)
    tpu = copy.deepcopy(cpu).to("tpu")
    x = torch.randn(3, 6)
    for m, xx in ((cpu, x), (tpu, x.to("tpu"))):
        (m(xx) * 10).square().sum().backward()
    return cpu, tpu


def test_clip_grad_norm_takes_foreach_norm_and_matches_cpu():
    cpu, tpu = _with_large_grads()
    want = torch.nn.utils.clip_grad_norm_(cpu.parameters(), 0.5)
    ops = _Ops()
    with ops:
        got = torch.nn.utils.clip_grad_norm_(tpu.parameters(), 0.5)
    assert ops.seen["_foreach_norm"] == 1
    torch.testing.assert_close(got.cpu(), want)
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad)


def test_clip_grad_value_takes_foreach_clamps_and_matches_cpu():
    cpu, tpu = _with_large_grads()
    torch.nn.utils.clip_grad_value_(cpu.parameters(), 0.5)
    ops = _Ops()
    with ops:
        torch.nn.utils.clip_grad_value_(tpu.parameters(), 0.5)
    assert ops.seen["_foreach_clamp_min_"] == 1 and ops.seen["_foreach_clamp_max_"] == 1
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad)


def _scaled_steps(name: str, device: str) -> tuple[torch.nn.Module, float, bool]:
    """``name`` under a GradScaler: two clean steps, one that overflows (skipped), one more."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3).to(device)
    opt = OPTIMIZERS[name](model.parameters())
    scaler = torch.amp.GradScaler(device, init_scale=2.0**4, growth_interval=2)
    x = torch.randn(4, 6).to(device)
    for k in range(4):
        opt.zero_grad()
        loss = model(x).square().mean() * (float("inf") if k == 2 else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return model, scaler.get_scale(), bool(opt.param_groups[0]["fused"])


@pytest.mark.parametrize("name", ["AdamW", "SGD"])
def test_fused_by_default_under_a_grad_scaler_matches_cpu(name):
    """From its second step the fused step takes the scale and the overflow flag itself
    (``_step_supports_amp_scaling``), as with ``fused=True`` on CUDA: an overflowing step
    is skipped and the scale backs off as on CPU."""
    cpu, cpu_scale, _ = _scaled_steps(name, "cpu")
    tpu, tpu_scale, fused = _scaled_steps(name, "tpu")
    assert fused and tpu_scale == cpu_scale
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), atol=1e-5, rtol=1e-4)
