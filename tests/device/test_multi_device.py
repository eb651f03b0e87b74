"""Several tpu devices: JAX's local devices are tpu:0..N-1 (issue 20).

The devices exist only if ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` is set
before JAX starts, so the checks run in one fresh interpreter (a module fixture; one
interpreter start for all of them), each check reported by name."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import copy, json, sys, traceback
    import torch, tpu_kernels
    from tpu_kernels.testing import assert_same
    from tpu_kernels.devices import jax_devices
    results = {}

    def check(fn):
        try:
            fn()
            results[fn.__name__] = "OK"
        except BaseException:
            results[fn.__name__] = traceback.format_exc()

    @check
    def basics():
        assert torch.tpu.device_count() == 2 and torch.accelerator.device_count() == 2
        a = torch.ones(3, device="tpu:1")
        assert a.device == torch.device("tpu", 1) and a.get_device() == 1
        b = a * 2 + 1                                   # runs where its inputs are
        assert b.device == torch.device("tpu", 1) and b.cpu().tolist() == [3.0, 3.0, 3.0]
        c = torch.arange(4.0).to("tpu:1")
        assert c.device.index == 1 and c.jax().devices() == {jax_devices()[1]}
        d = c.to("tpu:0")                               # a cross-device copy
        assert d.device.index == 0 and d.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
        e = torch.empty(4, device="tpu:1"); e.copy_(d)  # tpu:0 -> tpu:1 in place
        assert e.device.index == 1 and e.cpu().tolist() == d.cpu().tolist()
        f = torch.zeros(4, device="tpu:0", dtype=torch.float64); f.copy_(e * 2)   # tpu:1 -> tpu:0, cast
        assert f.device.index == 0 and f.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
        assert torch.zeros(2, device="tpu").device.index == 0     # (kept fills: keyed by device)
        torch.tpu.set_device(1)
        assert torch.tpu.current_device() == 1 and torch.zeros(2, device="tpu").device.index == 1
        z = torch.zeros(2, device="tpu")
        assert z.device.index == 1 and z.jax().devices() == {jax_devices()[1]}
        torch.tpu.set_device(0)
        with torch.tpu.device(1):
            assert torch.tpu.current_device() == 1 and torch.ones(1, device="tpu").device.index == 1
        assert torch.tpu.current_device() == 0
        m = torch.nn.Linear(3, 2).to("tpu:1")
        assert m(torch.randn(4, 3, device="tpu:1")).device.index == 1
        assert torch.tpu.memory_allocated(1) > 0
        try:
            torch.ones(1, device="tpu:2")
        except RuntimeError as exc:
            assert "invalid device ordinal" in str(exc)
        else:
            raise AssertionError("tpu:2 of 2 devices did not raise")

    @check
    def training_step():
        # (the optimizers' state is made with zeros_like: on the parameters' device)
        for make in (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                     lambda ps: torch.optim.AdamW(ps, lr=0.01),
                     lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True)):
            torch.manual_seed(0)
            cpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
            tpu = copy.deepcopy(cpu).to("tpu:1")
            x, y = torch.randn(5, 4), torch.randn(5, 2)
            for model, dev in ((cpu, "cpu"), (tpu, "tpu:1")):
                opt = make(model.parameters())
                for _ in range(2):
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev)).backward()
                    opt.step()
            for p, q in zip(cpu.parameters(), tpu.parameters()):
                assert q.device.index == 1 and q.grad.device.index == 1, (q.device, q.grad.device)
                for k, v in opt.state[q].items():   # (foreach AdamW counts steps on the CPU)
                    assert v.device.index == 1 or (k == "step" and v.device.type == "cpu"), (opt, k, v.device)
                assert_same(p.grad, q.grad)
                assert_same(p.detach(), q.detach())

    @check
    def like_ops_follow_their_input():
        b = torch.randn(2, 3).to("tpu:1")
        for _ in range(2):   # the first call of a signature and the eager hot path's
            made = {"zeros_like": torch.zeros_like(b), "ones_like": torch.ones_like(b),
                    "full_like": torch.full_like(b, 2.0), "empty_like": torch.empty_like(b),
                    "randn_like": torch.randn_like(b), "randint_like": torch.randint_like(b, 5),
                    "new_zeros": b.new_zeros(4), "new_full": b.new_full((4,), 3.0), "new_empty": b.new_empty(4),
                    "ones_like of a view": torch.ones_like(b.t()),
                    "named tpu:1": torch.zeros_like(torch.ones(2, device="tpu:0"), device="tpu:1")}
            for name, t in made.items():
                assert t.device.index == 1 and t.jax().devices() == {jax_devices()[1]}, (name, t.device)
        a = torch.zeros_like(b, device="tpu:0")
        assert a.device.index == 0 and a.jax().devices() == {jax_devices()[0]}
        with torch.tpu.device(1):     # "tpu": the current device, as torch.cuda's "cuda"
            c = torch.ones_like(torch.ones(2, device="tpu:0"), device="tpu")
        assert c.device.index == 1 and c.jax().devices() == {jax_devices()[1]}
        assert (torch.full_like(b, 2.0) * b).cpu().tolist() == (b.cpu() * 2).tolist()
        # data-dependent results (made from host values, unjitted) too
        for name, t in {"nonzero": torch.nonzero(b), "masked_select": b.masked_select(b > 0),
                        "unique": torch.unique(b.round())}.items():
            assert t.device.index == 1 and t.jax().devices() == {jax_devices()[1]}, (name, t.device)
        assert torch.nonzero(b).cpu().tolist() == torch.nonzero(b.cpu()).tolist()

    @check
    def mixed_devices_raise_torchs_error():
        a, b = torch.ones(3, device="tpu:0"), torch.ones(3, device="tpu:1")
        for _ in range(2):   # same geometry on one device first: the eager hot path indexes it
            assert (a + a).device.index == 0 and (b * b).device.index == 1
            assert (b + b).jax().devices() == {jax_devices()[1]}
        cases = {"tpu:0 and tpu:1": lambda: a + b, "tpu:1 and tpu:0": lambda: b * a,
                 "tpu:0 and cpu": lambda: a + torch.ones(3), "tpu:1 and cpu": lambda: torch.ones(3) + b}
        cases["tpu:1 and tpu:0"] = lambda: b[None] @ a[:, None]
        for want, fn in cases.items():
            try:
                fn()
            except RuntimeError as exc:
                assert str(exc).startswith(
                    f"Expected all tensors to be on the same device, but found at least two devices, {want}!"), exc
            else:
                raise AssertionError(f"no error for {want}")
        s = b + torch.tensor(2.0)                       # a 0-dim CPU tensor mixes as a scalar
        assert s.device.index == 1 and s.jax().devices() == {jax_devices()[1]}

    @check
    def deferred_on_the_second_device():
        torch.manual_seed(0)
        m, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
        mt, xt = copy.deepcopy(m).to("tpu:1"), x.to("tpu:1")
        with tpu_kernels.deferred():
            y = mt(xt).relu() + torch.ones(2, device="tpu:1")
            z = torch.full((3,), 2.0, device="tpu:0")  # another device in the same block
            y.sum().backward()
        assert y.device.index == 1 and z.device.index == 0 and mt.weight.grad.device.index == 1
        assert y.jax().devices() == {jax_devices()[1]} and z.jax().devices() == {jax_devices()[0]}
        want = m(x).relu() + 1
        want.sum().backward()
        assert_same(want.detach(), y.detach())
        assert_same(m.weight.grad, mt.weight.grad)
        assert z.cpu().tolist() == [2.0, 2.0, 2.0]

    @check
    def hf_llama_on_the_second_device():
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=128, use_cache=False)
        cpu = LlamaForCausalLM(cfg)
        ids = torch.randint(0, 128, (2, 8))
        trained = {}
        for dev in ("tpu:0", "tpu:1"):      # the same programs on either device: equal bits
            model = copy.deepcopy(cpu).to(dev)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            for _ in range(2):
                opt.zero_grad()
                model(ids.to(dev), labels=ids.to(dev)).loss.backward()
                opt.step()
            trained[dev] = model
        for p, q in zip(trained["tpu:0"].parameters(), trained["tpu:1"].parameters()):
            assert q.jax().devices() == {jax_devices()[1]} and torch.equal(p.detach().cpu(), q.detach().cpu())
        with torch.no_grad():   # greedy tokens as on the CPU
            want = cpu.generate(ids[:1], max_new_tokens=4, do_sample=False)
            got = copy.deepcopy(cpu).to("tpu:1").generate(ids[:1].to("tpu:1"), max_new_tokens=4, do_sample=False)
        assert got.device.index == 1 and torch.equal(got.cpu(), want)

    @check
    def compile_on_the_second_device_says_so():
        f = torch.compile(lambda x: x * 2, backend="tpu")
        try:
            f(torch.ones(3, device="tpu:1"))
        except Exception as exc:   # (Dynamo wraps it)
            assert "compiled functions run on tpu:0 only" in str(exc), exc
        else:
            raise AssertionError("no error")
        assert f(torch.ones(3, device="tpu:0")).cpu().tolist() == [2.0, 2.0, 2.0]

    @check
    def data_parallel_over_two_devices_says_so():
        m = torch.nn.DataParallel(torch.nn.Linear(2, 2)).to("tpu")   # device_ids: both tpu devices
        try:
            m(torch.ones(4, 2))
        except NotImplementedError as exc:
            assert "nn.DataParallel over 2 tpu devices" in str(exc), exc
        else:
            raise AssertionError("no error")
        one = torch.nn.DataParallel(torch.nn.Linear(2, 2), device_ids=[1])
        assert one(torch.ones(4, 2)).device == torch.device("tpu", 1)

    print(json.dumps(results))
''')


@pytest.fixture(scope="module")
def results() -> dict:
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu",
               TPU_KERNELS_JAX_CACHE="0")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_devices(results):
    assert results["basics"] == "OK", results["basics"]


def test_training_step_on_the_second_device_matches_cpu(results):
    """backward() of tensors on tpu:1 (torch's engine has one device queue for a Python
    backend: tpu_kernels.device runs backward on the calling thread with several devices);
    fused SGD, fused and foreach AdamW there, their state on tpu:1."""
    assert results["training_step"] == "OK", results["training_step"]


def test_like_ops_make_their_result_on_their_inputs_device(results):
    """``zeros_like(t)``, ``t.new_ones(n)``, ``randn_like(t)``, ``nonzero(t)``... of a tensor
    on tpu:1 live on tpu:1, a named ``device=`` wins, ``"tpu"`` is the current device (as
    on CUDA). (An OpInfo sweep, every op's first two float32 samples on tpu:1: 1289
    samples, every result on tpu:1.)"""
    assert results["like_ops_follow_their_input"] == "OK", results["like_ops_follow_their_input"]


def test_mixed_devices_raise_torchs_error(results):
    assert results["mixed_devices_raise_torchs_error"] == "OK", results["mixed_devices_raise_torchs_error"]


def test_deferred_mode_on_the_second_device(results):
    assert results["deferred_on_the_second_device"] == "OK", results["deferred_on_the_second_device"]


def test_a_transformers_llama_trains_and_generates_on_the_second_device(results):
    """A tiny Llama (transformers' own code: ``zeros_like``, ``arange``, masks made on the
    inputs' device) with AdamW on tpu:1: bit for bit what it does on tpu:0, every
    parameter kept on tpu:1; greedy ``generate`` gives CPU's tokens."""
    assert results["hf_llama_on_the_second_device"] == "OK", results["hf_llama_on_the_second_device"]


def test_compile_on_the_second_device_raises_a_clear_error(results):
    """Known limit: torch's Python-backend API makes plain tensors on tpu:0 only, so
    torch.compile cannot trace tensors on tpu:1 (``shadow._not_on_tpu0``): it says so."""
    assert results["compile_on_the_second_device_says_so"] == "OK", results["compile_on_the_second_device_says_so"]


def test_data_parallel_over_several_devices_raises_a_clear_error(results):
    """nn.DataParallel's default device_ids take every tpu device: refused with what to use;
    given one device it runs there."""
    assert results["data_parallel_over_two_devices_says_so"] == "OK", results["data_parallel_over_two_devices_says_so"]
