"""Real-model parity harness: the same model on CPU torch and on tpu, compared.

A ``Case`` says how to build a model (random weights, from a configuration object; no
downloads), how to make its inputs, which outputs to compare and what loss to train on.
``check_forward`` runs the model in eval mode on both devices; ``check_train_step`` runs
one forward + backward + AdamW step on both and compares the loss, every gradient and
every parameter after the step.

A failure always names the ATen op behind it:

* an op that raises on tpu (``NotImplementedError`` for an op with no tpu impl, or any
  other error) fails the test with that error, whose message names the overload;
* a numerical mismatch reruns the model on CPU under ``OpByOp``, a ``TorchDispatchMode``
  that replays every ATen op on tpu with the *same* inputs and compares the two results,
  so the first op that disagrees (or cannot run) is named in the assertion message,
  without the error that builds up over many ops hiding where it started.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import traceback
import zlib
from typing import Any, Callable, Iterator

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils._python_dispatch import TorchDispatchMode

from tpu_kernels.testing import TOLERANCES, in_float64

F32 = tuple(TOLERANCES[torch.float32])  # (atol, rtol) for float32 from the library's table


@dataclasses.dataclass
class Case:
    name: str
    build: Callable[[], torch.nn.Module]            # called right after torch.manual_seed(0)
    inputs: Callable[[], dict]                       # CPU keyword inputs; seeded with 1
    output: Callable[[Any], Any] = None              # forward outputs to compare (default: logits)
    loss: Callable[[Any, dict], torch.Tensor] = None  # training loss from (model output, inputs)
    fwd_tol: tuple[float, float] = F32               # (atol, rtol)
    train_tol: tuple[float, float] = F32
    xfail_forward: str | None = None                 # reason naming the ATen op
    xfail_train: str | None = None
    # a training step whose float32 drift passes on some CPUs and not on others (non-strict
    # xfail; the reason says where it fails and why it is rounding)
    drifts_train: str | None = None
    thorough: bool = False                           # slow: run with --thorough only

    def params(self, which: str, in_ci: bool = True) -> Any:
        marks = []
        # the compiled step ("compiled") runs the training step's ops: its known failures
        xf = self.xfail_forward if which == "forward" else self.xfail_train
        if xf:
            marks.append(pytest.mark.xfail(strict=True, reason=xf))
        if which != "forward" and self.drifts_train:
            marks.append(pytest.mark.xfail(strict=False, reason=self.drifts_train))
        if self.thorough or not in_ci:
            marks.append(pytest.mark.thorough)
        return pytest.param(self, id=self.name, marks=marks)


def default_output(out: Any) -> Any:
    for key in ("logits", "last_hidden_state", "prediction_logits"):
        v = getattr(out, key, None)
        if isinstance(v, torch.Tensor):
            return v
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return out[0]
    raise TypeError(f"pick the outputs to compare for {type(out)}")


def default_loss(out: Any, inputs: dict) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    return default_output(out).float().pow(2).mean()


def _to(x: Any, device: str) -> Any:
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, x)


def move_to_tpu(model: torch.nn.Module) -> torch.nn.Module:
    """``model.to("tpu")``: the runtime keeps tied parameters tied (it swaps parameters in
    place when a module moves to tpu; ``test_model_moves.py`` checks it)."""
    return model.to("tpu")


def _pair(case: Case, train: bool):
    torch.manual_seed(0)
    cpu = case.build()
    cpu.train(train)
    tpu = move_to_tpu(copy.deepcopy(cpu))
    torch.manual_seed(1)
    inputs = case.inputs()
    return cpu, tpu, inputs


def _run_tpu(case: Case, what: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` on tpu; an error fails the test with the message that names the op."""
    try:
        out = fn()
        _sync(out)
        return out
    except Exception as exc:  # noqa: BLE001
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        op = failing_op(exc)
        where = f" in {op}" if op is not None and str(op) not in last else ""
        pytest.fail(f"{case.name} {what} failed on tpu{where}: {last}", pytrace=False)


def failing_op(exc: BaseException) -> Any:
    """The innermost ATen op being dispatched when ``exc`` was raised (from the frames of
    the traceback: a local ``func``/``op`` that is an OpOverload), or None."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        for name in ("func", "op", "overload"):
            v = tb.tb_frame.f_locals.get(name)
            if isinstance(v, torch._ops.OpOverload):
                found = v
                break
        tb = tb.tb_next
    if found is None and exc.__context__ is not None and exc.__context__ is not exc:
        return failing_op(exc.__context__)
    return found


def _sync(out: Any) -> None:
    # values are read back (errors deferred to the next sync are raised here)
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and t.device.type == "tpu":
            t.cpu()


def _compare(expected: Any, actual: Any, tol: tuple[float, float]) -> str | None:
    e_leaves, a_leaves = _leaves(expected), _leaves(actual)
    if len(e_leaves) != len(a_leaves):
        return f"{len(a_leaves)} outputs, expected {len(e_leaves)}"
    for i, (e, a) in enumerate(zip(e_leaves, a_leaves)):
        if not isinstance(e, torch.Tensor):
            if e != a and not (e != e and a != a):
                return f"output {i}: {a!r} != {e!r}"
            continue
        if not isinstance(a, torch.Tensor):
            return f"output {i}: got {type(a)}, expected a tensor"
        a = a.detach().cpu()
        e = e.detach()
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"output {i}: {a.dtype}{list(a.shape)} vs expected {e.dtype}{list(e.shape)}"
        atol, rtol = tol if e.is_floating_point() or e.is_complex() else (0.0, 0.0)
        try:
            torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True)
        except AssertionError as err:
            return f"output {i} {list(e.shape)}: {err}"
    return None


def _leaves(x: Any) -> list:
    return [v for v in tree_flatten(x)[0]]


# -- telling accumulated rounding from a wrong result: a float64 reference ----------------------
def float64_run(case: Case, train: bool) -> Any:
    """The same model and inputs on CPU in float64: the forward outputs, or (loss, grads) of
    the training step; None when the model cannot run in float64."""
    torch.manual_seed(0)
    model = case.build().double()
    model.train(train)
    torch.manual_seed(1)
    inputs = in_float64(case.inputs())
    default = torch.get_default_dtype()
    # tensors the model or its loss makes as it runs (DETR's loss: its class weights,
    # torch.ones(n)) take the default dtype
    torch.set_default_dtype(torch.float64)
    try:
        if train:
            return _step(model, case, inputs)
        with torch.no_grad():
            return (case.output or default_output)(model(**inputs))
    except Exception:  # noqa: BLE001 - a model that only runs in float32
        return None
    finally:
        torch.set_default_dtype(default)


def as_accurate(expected: Any, actual: Any, ref: Any, tol: tuple[float, float]) -> str | None:
    """None when ``actual`` (tpu) is as close to the float64 result ``ref`` as ``expected``
    (CPU) is, up to the tolerance: each element within ``atol + rtol * |ref|`` plus twice
    CPU's largest error. The two float32 results may then differ by more than the tolerance
    (both round a long sum, in different orders), but tpu is not less accurate than CPU."""
    atol, rtol = tol
    for e, a, r in zip(_leaves(expected), _leaves(actual), _leaves(ref)):
        if not isinstance(e, torch.Tensor) or not e.is_floating_point():
            continue
        r = r.detach().double()
        cpu_err = (e.detach().double() - r).abs().max().item() if r.numel() else 0.0
        bound = 2 * cpu_err + atol + rtol * r.abs()
        err = (a.detach().cpu().double() - r).abs()
        if err.numel() and not bool((err <= bound).all()):
            i = int((err - bound).argmax())
            return (f"tpu is off the float64 result by {err.flatten()[i].item():.3g} where CPU's largest "
                    f"error is {cpu_err:.3g}")
    return None


# -- localising a mismatch: every ATen op replayed on tpu with the CPU op's inputs -----------
class OpByOp(TorchDispatchMode):
    """Records every ATen op of a CPU run with copies of its inputs and its result;
    ``replay()`` then runs each op on tpu with the same inputs and names the first ops whose
    results disagree (beyond ``tol``) or that fail on tpu. (The replay happens after the
    mode exits: tpu ops issued inside a dispatch-mode handler do not run, see the report.)"""

    def __init__(self, tol: tuple[float, float], limit: int = 3) -> None:
        super().__init__()
        self.tol = tol
        self.limit = limit
        self.calls: list = []
        self.checked = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if any(t.device.type != "cpu" for t in tensors):
            return func(*args, **kwargs)
        snap = tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, (args, kwargs))
        out = func(*args, **kwargs)
        self.calls.append((func, snap, tree_map(
            lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, out)))
        return out

    def replay(self) -> list[str]:
        bad = []
        for func, (args, kwargs), out in self.calls:
            if len(bad) >= self.limit:
                break
            try:
                tout = func(*_to_tpu_args(args), **_to_tpu_args(kwargs))
                _sync(tout)
            except Exception as exc:  # noqa: BLE001
                msg = traceback.format_exception_only(type(exc), exc)[-1].strip().splitlines()[0]
                bad.append(f"{func}: fails on tpu: {msg}")
                continue
            self.checked += 1
            why = _compare(out, tout, self.tol)
            if why is not None:
                shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in tree_flatten((args, kwargs))[0]
                                   if isinstance(a, torch.Tensor))
                bad.append(f"{func}({shapes}): {why.splitlines()[0]} | " + " ".join(why.split()[-30:]))
        return bad


def _to_tpu_args(x: Any) -> Any:
    def conv(v):
        if isinstance(v, torch.Tensor):
            return v.detach().clone().to("tpu") if v.device.type == "cpu" else v
        if isinstance(v, torch.device) and v.type == "cpu":
            return torch.device("tpu")
        return v
    return tree_map(conv, x)


def localise(case: Case, train: bool, tol: tuple[float, float]) -> str:
    """Rerun the CPU model op by op (forward, and backward when ``train``). Not for a known
    failure (a strict xfail, whose reason names the op): the replay costs as much as the
    check itself."""
    known = case.xfail_train if train else case.xfail_forward
    if known:
        return f"(not replayed op by op: a known failure: {known})"
    torch.manual_seed(0)
    model = case.build()
    model.train(train)
    torch.manual_seed(1)
    inputs = case.inputs()
    mode = OpByOp(tol)
    try:
        with mode:
            if train:
                loss = (case.loss or default_loss)(model(**inputs), inputs)
                loss.backward()
            else:
                with torch.no_grad():
                    model(**inputs)
    except Exception as exc:  # noqa: BLE001
        return f"(op-by-op recording stopped: {exc})"
    bad = mode.replay()
    if not bad:
        return (f"op by op, all {mode.checked} ATen ops match within {tol}: the difference "
                f"is accumulated float32 rounding, not one wrong op")
    return "first ops that disagree when replayed alone on tpu:\n  " + "\n  ".join(bad)


# -- the two checks ---------------------------------------------------------------------------
def check_forward(case: Case, inference_mode: bool = False) -> None:
    """The forward on CPU and tpu under ``torch.no_grad()`` (or ``torch.inference_mode()``)."""
    cpu, tpu, inputs = _pair(case, train=False)
    pick = case.output or default_output
    with torch.inference_mode() if inference_mode else torch.no_grad():
        expected = pick(cpu(**inputs))
        actual = _run_tpu(case, "forward", lambda: pick(tpu(**_to(inputs, "tpu"))))
    why = _compare(expected, actual, case.fwd_tol)
    if why is not None:
        ref = float64_run(case, train=False)
        worse = as_accurate(expected, actual, ref, case.fwd_tol) if ref is not None else "no float64 run"
        if worse is not None:
            pytest.fail(f"{case.name} forward differs from CPU: {why}\n({worse})\n{localise(case, False, F32)}",
                        pytrace=False)


def _loss_and_grads(model: torch.nn.Module, case: Case, inputs: dict,
                    forward: Callable[..., Any] | None = None) -> tuple[torch.Tensor, dict]:
    """The loss of ``forward(**inputs)`` (default: the model) and every parameter's gradient."""
    model.zero_grad(set_to_none=True)
    loss = (case.loss or default_loss)((model if forward is None else forward)(**inputs), inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _step(model: torch.nn.Module, case: Case, inputs: dict) -> tuple[torch.Tensor, dict]:
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    loss, grads = _loss_and_grads(model, case, inputs)
    opt.step()
    return loss, grads


LR = 1e-3


def _step_differences(case: Case, expected: tuple, actual: tuple) -> list[str]:
    """Loss and gradients that differ from CPU's and are not as close to the float64 step."""
    (e_loss, e_grads), (a_loss, a_grads) = expected, actual
    pairs = [("loss", e_loss, a_loss)] + [(f"grad of {n}", e_grads[n], a_grads[n])
                                          for n in sorted(set(e_grads) & set(a_grads))]
    differ = [(what, e, a, why) for what, e, a in pairs
              if (why := _compare(e, a, case.train_tol)) is not None]
    if not differ:
        return []
    ref = float64_run(case, train=True)
    refs = {} if ref is None else {"loss": ref[0], **{f"grad of {n}": g for n, g in ref[1].items()}}
    out = []
    for what, e, a, why in differ:
        worse = as_accurate(e, a, refs[what], case.train_tol) if what in refs else "no float64 run"
        if worse is not None:
            out.append(f"{what}: {why} ({worse})")
    return out


def check_train_step(case: Case) -> None:
    """Loss and gradients against CPU; the AdamW step against CPU's AdamW given tpu's grads.

    The parameters after the step are not compared with the CPU model's: Adam's first step
    moves each weight by about ``lr * sign(grad)``, so a gradient that is zero up to
    rounding (the key bias of softmax attention, exactly zero in exact arithmetic) moves by
    ``+-lr`` depending on the sign of its rounding noise. Instead the tpu step is checked
    against torch's AdamW on CPU applied to the same starting weights and the tpu grads.
    """
    cpu, tpu, inputs = _pair(case, train=True)
    start = {n: p.detach().clone() for n, p in cpu.named_parameters()}
    e_loss, e_grads = _step(cpu, case, inputs)
    a_loss, a_grads = _run_tpu(case, "forward+backward+AdamW step",
                               lambda: _step(tpu, case, _to(inputs, "tpu")))
    assert all(p.device.type == "tpu" for p in tpu.parameters())
    problems = []
    missing = sorted(set(e_grads) ^ set(a_grads))
    if missing:
        problems.append(f"gradients present on one device only: {missing}")
    problems += _step_differences(case, (e_loss, e_grads), (a_loss, a_grads))
    # buffers updated in the forward (BatchNorm running statistics)
    e_bufs = dict(cpu.named_buffers())
    for n, b in tpu.named_buffers():
        why = _compare(e_bufs[n], b, case.train_tol)
        if why:
            problems.append(f"buffer {n} after the step: {why}")
    # torch's AdamW on CPU from the same weights with the tpu grads
    names = [n for n, _ in tpu.named_parameters()]
    ref = [torch.nn.Parameter(start[n].clone()) for n in names]
    for n, p in zip(names, ref):
        p.grad = a_grads[n].cpu() if n in a_grads else None
    torch.optim.AdamW(ref, lr=LR).step()
    for n, r, p in zip(names, ref, tpu.parameters()):
        why = _compare(r.detach(), p, F32)
        if why:
            problems.append(f"{n} after the AdamW step (vs CPU AdamW with the tpu grads): {why}")
    if problems:
        pytest.fail(f"{case.name} training step differs from CPU ({len(problems)} tensors):\n"
                    f"{_head(problems)}\n{localise(case, True, F32)}", pytrace=False)


def _head(problems: list[str]) -> str:
    """The first few problems, each its first line and its last words (the figures)."""
    return "\n".join(p.splitlines()[0] + " " + " ".join(p.split()[-12:]) for p in problems[:5])


@contextlib.contextmanager
def _tpu_backend_compiles(case: Case) -> Iterator[None]:
    """Fresh Dynamo caches around the block (Dynamo keeps 8 graphs per code object, then
    runs it uncompiled: models of one class built with other configurations must not use
    them up), and the tpu backend must have compiled a graph in it."""
    from tpu_kernels import compile_backend
    torch._dynamo.reset()
    programs = len(compile_backend.PROGRAMS)
    yield
    assert len(compile_backend.PROGRAMS) > programs, f"{case.name}: the tpu backend compiled no graph"
    torch._dynamo.reset()


def check_compiled_train_step(case: Case) -> None:
    """The model under ``torch.compile(model, backend="tpu")``, its loss (the model's own
    ``.loss``, or ``case.loss`` on its outputs, computed eagerly) and ``backward()`` eager, as
    a training loop is written: the loss and every gradient against CPU eager, on the first
    call (compiling) and the second (the cached graphs)."""
    cpu, tpu, inputs = _pair(case, train=True)
    expected = _loss_and_grads(cpu, case, inputs)
    # allow_rnn: else Dynamo runs a function with an LSTM eagerly
    with _tpu_backend_compiles(case), torch._dynamo.config.patch(allow_rnn=True):
        _compiled_calls(case, tpu, torch.compile(tpu, backend="tpu"), _to(inputs, "tpu"), expected)


def _compiled_calls(case: Case, tpu: torch.nn.Module, compiled: Callable[..., Any], tpu_inputs: dict,
                    expected: tuple) -> None:
    for call in ("first", "second"):
        loss, grads = _run_tpu(case, f"compiled forward+backward ({call} call)",
                               lambda: _loss_and_grads(tpu, case, tpu_inputs, compiled))
        # AOTAutograd gives a parameter that feeds only unused outputs a zero gradient where
        # eager leaves None (LLaVA's vision post-layernorm); aot_eager on CPU does the same
        actual = (loss, {n: g for n, g in grads.items() if n in expected[1] or g.cpu().any()})
        missing = sorted(set(expected[1]) ^ set(actual[1]))
        problems = [f"gradients present on one device only: {missing}"] if missing else []
        problems += _step_differences(case, expected, actual)
        if problems:
            pytest.fail(f"{case.name} compiled training step ({call} call) differs from CPU "
                        f"({len(problems)} tensors):\n{_head(problems)}", pytrace=False)


def check_compiled_generate(case: Case, cache: str, new_tokens: int = 4) -> None:
    """Greedy ``generate()`` of a model whose forward is ``torch.compile(..., backend="tpu")``
    gives CPU's tokens, with transformers' default dynamic cache or ``cache="static"``."""
    torch.manual_seed(0)
    cpu = case.build().eval()
    cpu.generation_config.eos_token_id = None    # every run makes all its tokens
    if cpu.generation_config.pad_token_id is None:
        cpu.generation_config.pad_token_id = 0
    tpu = move_to_tpu(copy.deepcopy(cpu))
    torch.manual_seed(1)
    prompt = case.inputs()["input_ids"][:1]
    kw = dict(max_new_tokens=new_tokens, do_sample=False)
    if cache == "static":
        kw["cache_implementation"] = "static"
    want = cpu.generate(prompt, **kw)
    with _tpu_backend_compiles(case):
        tpu.forward = torch.compile(tpu.forward, backend="tpu")
        # disable_compile: generate() would compile the forward itself for a static cache
        got = _run_tpu(case, f"compiled generate ({cache} cache)",
                       lambda: tpu.generate(prompt.to("tpu"), disable_compile=True, **kw))
    assert torch.equal(got.cpu(), want), f"{case.name} ({cache} cache): {got.cpu().tolist()} vs CPU {want.tolist()}"


def _breaks(model: torch.nn.Module, inputs: dict) -> tuple[int, int, set[str]]:
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        e = torch._dynamo.explain(model)(**inputs)
    return e.graph_count, e.graph_break_count, {str(b.reason).splitlines()[0] for b in e.break_reasons}


def check_graph_breaks(case: Case) -> None:
    """``torch._dynamo.explain`` of the training forward: on tpu no more graphs and graph
    breaks than on CPU, for no other reasons."""
    cpu, tpu, inputs = _pair(case, train=True)
    want = _breaks(cpu, inputs)
    got = _breaks(tpu, _to(inputs, "tpu"))
    torch._dynamo.reset()
    assert got[0] <= want[0] and got[1] <= want[1] and got[2] <= want[2], \
        f"{case.name}: (graphs, breaks) {got[:2]} on tpu, {want[:2]} on CPU; tpu's reasons {sorted(got[2] - want[2])}"


def check_compiles_for_tpu(case: Case, chip: str = "v5e") -> None:
    """The compiled training step's forward and backward graphs, as the tpu backend builds
    them (``aot.graphs.capture``: whole graphs, no breaks), compiled for ``chip`` by libtpu's
    compile-only topology: XLA:TPU and Mosaic accept every program."""
    from tpu_kernels.aot import graphs, topology
    from tpu_kernels.aot.compiler import compile_lowered, explain
    from tpu_kernels.pallas import tpu_info
    _, tpu, inputs = _pair(case, train=True)
    keys, tpu_inputs = list(inputs), _to(inputs, "tpu")

    def step(*values):
        kw = dict(zip(keys, values))
        return (case.loss or default_loss)(tpu(**kw), kw)
    with tpu_info.compile_for(chip), torch._dynamo.config.patch(allow_rnn=True):
        captured = graphs.capture(step, *[tpu_inputs[k] for k in keys])
    failed = []
    for g in captured:
        try:
            compile_lowered(lambda g=g: graphs.lower(g, topology.sharding(chip)), chip)
        except Exception as exc:  # noqa: BLE001  (the compiler's verdict)
            failed.append(f"{g.kind}: {explain(exc)}")
    assert {g.kind for g in captured} == {"forward", "backward"}, [g.kind for g in captured]
    assert not failed, f"{case.name} on {chip}: " + "; ".join(failed)


FORWARD_SHARE = 3   # CI runs the forward of one forward-only model in this many


def forward_in_ci(case: Case, train_in_ci: set[str]) -> bool:
    """Whether CI runs ``case``'s forward check: not when its training step runs in CI (the
    step runs the same forward), else for a fixed third of the models (by a hash of the name,
    the same on every machine) and every known forward failure, so the xfails stay checked."""
    if case.name in train_in_ci:
        return False
    return bool(case.xfail_forward) or zlib.crc32(case.name.encode()) % FORWARD_SHARE == 0


def suite_tests(cases: list[Case], train_in_ci: set[str],
                compiled_in_ci: set[str]) -> tuple[Callable, Callable, Callable]:
    """A model file's three tests over its ``cases``: ``test_forward, test_train_step,
    test_compiled_train_step = suite_tests(CASES, {...}, {...})`` (pytest collects them by
    those names).

    CI checks the training step of the models named in ``train_in_ci`` (one or two per
    mechanism the file covers; the step runs the same forward ops in train mode) and the
    forward of a third of the others (``forward_in_ci``); ``--thorough`` runs both checks of
    every model. A training step costs CI about 10 s (most of it compiling the backward's
    ops), 97 of them a third of CI's time budget, and most models' backward ops are the same
    few dozen (each is also an op-level parity case)."""
    unknown = (train_in_ci | compiled_in_ci) - {c.name for c in cases}
    assert not unknown, f"train_in_ci / compiled_in_ci name models with no case: {sorted(unknown)}"

    @pytest.mark.parametrize("case", [c.params("forward", forward_in_ci(c, train_in_ci)) for c in cases])
    def test_forward(case):
        check_forward(case)

    @pytest.mark.parametrize("case", [c.params("train", c.name in train_in_ci) for c in cases])
    def test_train_step(case):
        check_train_step(case)

    # the compiled step: every model with --thorough (~5-20 s each), one per family in CI
    @pytest.mark.parametrize("case", [c.params("compiled", c.name in compiled_in_ci) for c in cases])
    def test_compiled_train_step(case):
        check_compiled_train_step(case)
    return test_forward, test_train_step, test_compiled_train_step
