"""torch.tpu answers what torch.cuda does: memory, names, streams, events, generators,
torch.accelerator, pinned memory, channels_last (issue 20)."""
from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest
import torch

import tpu_kernels  # noqa: F401
from tpu_kernels.dispatch import cache_info
from tpu_kernels.testing import assert_same


def test_memory_counters_move_with_tensors():
    gc.collect()
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.memory_allocated()
    x = torch.empty(1024, 256, device="tpu")            # 1 MiB of float32
    assert torch.tpu.memory_allocated() - before == 1024 * 256 * 4
    assert torch.tpu.max_memory_allocated() >= before + 1024 * 256 * 4
    v = x[:10]                                           # a view holds no memory of its own
    assert torch.tpu.memory_allocated() - before == 1024 * 256 * 4
    del x, v
    gc.collect()
    assert torch.tpu.memory_allocated() == before
    assert torch.tpu.max_memory_allocated() >= before + 1024 * 256 * 4
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == before
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == before
    assert torch.tpu.memory_reserved() >= 0 and torch.tpu.max_memory_reserved() >= 0
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    assert "allocated_bytes.all.current" in torch.tpu.memory_summary()


def test_empty_cache_drops_executables():
    torch.ones(3, device="tpu").add(1).cpu()
    assert cache_info()["ops"].size > 0
    torch.tpu.empty_cache()
    assert cache_info()["ops"].size == 0 and cache_info()["views"].size == 0
    assert torch.ones(3, device="tpu").add(1).cpu().tolist() == [2.0, 2.0, 2.0]


def test_device_name_and_properties():
    name = torch.tpu.get_device_name()
    assert name == torch.tpu.get_device_name(0) == torch.tpu.get_device_properties(0).name
    assert name == "cpu (no TPU)" or name.startswith("TPU")
    props = torch.tpu.get_device_properties(torch.device("tpu"))
    assert props.total_memory > 0 and props.index == 0


def test_device_index_errors_like_cuda():
    for bad in (lambda: torch.ones(1, device="tpu:7"), lambda: torch.tpu.set_device(7),
                lambda: torch.zeros(2).to("tpu:7"), lambda: torch.tpu.device(7).__enter__()):
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            bad()
    with torch.tpu.device(0):
        assert torch.tpu.current_device() == 0


def test_streams_and_events():
    s = torch.tpu.Stream()
    assert torch.tpu.current_stream() == torch.tpu.default_stream()
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream() is s
        y = torch.randn(64, 64, device="tpu") @ torch.randn(64, 64, device="tpu")
    assert torch.tpu.current_stream() == torch.tpu.default_stream()
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    y = y @ y
    end.record()
    end.synchronize()
    assert end.query() and s.query()
    assert start.elapsed_time(end) >= 0.0
    s.wait_event(end)
    s.wait_stream(torch.tpu.default_stream())
    s.synchronize()
    ev = s.record_event()
    with pytest.raises(RuntimeError, match="enable_timing"):
        ev.elapsed_time(end)


def test_accelerator_api():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "tpu"
    assert torch.accelerator.device_count() == torch.tpu.device_count()
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.synchronize()
    x = torch.ones(256, device="tpu")
    assert torch.accelerator.memory_allocated() >= x.numel() * 4
    assert torch.accelerator.current_stream() == torch.tpu.current_stream()
    torch.accelerator.empty_cache()


def test_generator_on_tpu():
    g = torch.Generator(device="tpu")
    assert g.device == torch.device("tpu", 0) and isinstance(g, torch.Generator)
    assert isinstance(torch.default_generator, torch.Generator)
    g.manual_seed(1)
    a = torch.randn(5, device="tpu", generator=g)
    state = g.get_state()
    b = torch.randn(5, device="tpu", generator=g)
    g.set_state(state)
    assert torch.equal(torch.randn(5, device="tpu", generator=g).cpu(), b.cpu())
    assert not torch.equal(a.cpu(), b.cpu())
    g.manual_seed(1)
    assert torch.equal(torch.randn(5, device="tpu", generator=g).cpu(), a.cpu())
    x, y = torch.empty(6, device="tpu"), torch.empty(6, device="tpu")
    x.uniform_(generator=g.manual_seed(3))
    y.uniform_(generator=g.manual_seed(3))
    assert torch.equal(x.cpu(), y.cpu()) and g.initial_seed() == 3
    torch.manual_seed(0)                                 # the device generator is untouched
    u = torch.rand(4, device="tpu")
    torch.manual_seed(0)
    torch.rand(4, device="tpu", generator=g)
    assert torch.equal(torch.rand(4, device="tpu").cpu(), u.cpu())
    assert torch.Generator().device.type == "cpu"


def test_pinned_memory_and_non_blocking_copies():
    t = torch.arange(6.0)
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned()
    assert torch.equal(p, t)
    x = p.to("tpu", non_blocking=True)
    assert x.device.type == "tpu" and x.cpu().tolist() == t.tolist()
    back = x.to("cpu", non_blocking=True)
    torch.tpu.synchronize()
    assert back.tolist() == t.tolist()
    data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.arange(8))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    for xb, yb in loader:
        assert xb.is_pinned() and yb.is_pinned()
        assert xb.to("tpu", non_blocking=True).shape == (4, 3)


@pytest.mark.parametrize("make", [
    lambda x: x.to(memory_format=torch.channels_last),
    lambda x: x.contiguous(memory_format=torch.channels_last),
    lambda x: x.clone(memory_format=torch.channels_last),
])
def test_channels_last_answers_as_torch(make):
    cpu = torch.randn(2, 3, 4, 5)
    want, got = make(cpu), make(cpu.to("tpu"))
    assert got.stride() == want.stride()
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    torch.testing.assert_close((got * 2).cpu(), want * 2, rtol=0, atol=0)
    e = torch.empty(2, 3, 4, 5, device="tpu", memory_format=torch.channels_last)
    assert e.stride() == torch.empty(2, 3, 4, 5, memory_format=torch.channels_last).stride()


@pytest.mark.parametrize("layout", ["input", "weight", "neither"])
def test_conv2d_result_layout_follows_torch(layout):
    """A channels-last input or weight gives channels-last conv results (the output, and in
    backward the input's gradient) as torch's CPU and CUDA convolutions do."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 6, 6)
    if layout == "weight":
        conv = conv.to(memory_format=torch.channels_last)
    if layout == "input":
        x = x.contiguous(memory_format=torch.channels_last)
    tconv = torch.nn.Conv2d(3, 4, 3, padding=1).to("tpu", memory_format=torch.channels_last if layout == "weight"
                                                   else torch.contiguous_format)
    tconv.load_state_dict(conv.state_dict())
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    want, got = conv(xc), tconv(xt)
    assert got.stride() == want.stride()
    assert got.is_contiguous(memory_format=torch.channels_last) == want.is_contiguous(memory_format=torch.channels_last)
    assert_same(want, got)
    want.square().sum().backward()
    got.square().sum().backward()
    assert xt.grad.stride() == xc.grad.stride()
    assert_same(xc.grad, xt.grad)
    assert_same(conv.weight.grad, tconv.weight.grad)


def test_import_leaves_dynamo_to_the_first_compile():
    """``import tpu_kernels`` loads neither Dynamo nor inductor (issue 20: import time);
    torch.compile(backend="tpu") finds the backend through the package's entry point. An
    install older than the entry point registers the backend at import instead (Dynamo
    loaded), so ``torch.compile`` works either way."""
    code = ("import sys, torch, tpu_kernels\n"
            "from tpu_kernels import platform\n"
            "print(platform.dynamo_backend_installed(), 'torch._dynamo' in sys.modules,"
            " 'torch._inductor' in sys.modules)\n"
            "f = torch.compile(lambda x: (x * 2).sum(), backend='tpu')\n"
            "print(f(torch.ones(3, device='tpu')).item())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    installed, dynamo, inductor = out.stdout.split()[:3]
    if installed == "True":
        assert (dynamo, inductor) == ("False", "False"), out.stdout
    else:
        assert dynamo == "True", out.stdout
    assert out.stdout.split()[3] == "6.0", out.stdout


def test_persistent_compile_cache_uses_atomic_file_cache(tmp_path):
    """Eager mode's JAX cache is ``jax_cache.FileCache``: entries are written whole (no
    reader sees half an executable) and a second process reads them back."""
    code = ("import jax, tpu_kernels, torch; print((torch.ones(3, device='tpu') + 1).cpu().tolist()); "
            "from jax._src import compilation_cache as cc; print(type(cc._cache).__name__)")
    env = dict(os.environ, TPU_KERNELS_JAX_CACHE=str(tmp_path), JAX_PLATFORMS="cpu")
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.split("\n")[:2] == ["[2.0, 2.0, 2.0]", "FileCache"]
    entries = sorted(tmp_path.glob("*-cache"))
    assert entries and not list(tmp_path.glob("*.tmp")), sorted(p.name for p in tmp_path.iterdir())
    stamp = {p: p.stat().st_mtime_ns for p in entries}
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.split("\n")[0] == "[2.0, 2.0, 2.0]"
    assert sorted(tmp_path.glob("*-cache")) == entries, "the second process compiled again"
    assert any(p.stat().st_mtime_ns > t for p, t in stamp.items()), "a hit did not mark its entry used"


def test_file_cache_prunes_least_recently_used(tmp_path):
    """Over its bound, the cache drops the oldest entries down to three quarters of it (at
    most once an hour per directory), and the temporary files of writers that died."""
    import time

    from tpu_kernels import jax_cache
    now = time.time()
    for i in range(8):
        (tmp_path / f"k{i}-cache").write_bytes(b"x" * 1000)
        os.utime(tmp_path / f"k{i}-cache", (now - 100 + i, now - 100 + i))   # k0 oldest
    (tmp_path / "dead.tmp").write_bytes(b"x")
    os.utime(tmp_path / "dead.tmp", (now - 7200, now - 7200))
    (tmp_path / "calls").mkdir()   # the call cache's subdirectory: not JAX's to prune
    cache = jax_cache.FileCache(str(tmp_path), limit_bytes=6000)
    assert cache.get("k0") == b"x" * 1000   # a hit: k0 is now the newest
    cache.put("new", b"y" * 1000)
    left = sorted(p.name for p in tmp_path.glob("*-cache"))
    assert left == ["k0-cache", "k6-cache", "k7-cache", "new-cache"], left
    assert not (tmp_path / "dead.tmp").exists() and (tmp_path / "calls").is_dir()
    cache.put("again", b"z" * 5000)   # pruned once an hour, not at every write
    assert (tmp_path / "k6-cache").exists()
    assert cache.get("missing") is None


LIKE_ON_ANOTHER_DEVICE = {
    "zeros_like cpu": lambda x: torch.zeros_like(x, device="cpu"),
    "ones_like cpu int": lambda x: torch.ones_like(x, device="cpu", dtype=torch.int64),
    "full_like cpu": lambda x: torch.full_like(x, 3.0, device="cpu"),
    "empty_like meta": lambda x: torch.empty_like(x, device="meta"),
    "zeros_like cpu contiguous": lambda x: torch.zeros_like(x, device="cpu", memory_format=torch.contiguous_format),
    "new_zeros cpu": lambda x: x.new_zeros(2, 5, device="cpu"),
    "new_full cpu": lambda x: x.new_full((2,), 1.5, device="cpu"),
    "new_ones meta": lambda x: x.new_ones(4, device="meta"),
}


@pytest.mark.parametrize("name", LIKE_ON_ANOTHER_DEVICE)
def test_like_and_new_ops_honour_another_device(name):
    """``torch.zeros_like(t, device="cpu")`` and ``t.new_zeros(..., device="cpu")`` of a tpu
    ``t`` make a CPU tensor as on CUDA (CPU-offload code does this); they made a tpu one."""
    f = LIKE_ON_ANOTHER_DEVICE[name]
    cpu_x = torch.randn(2, 3).t()                       # a transposed layout: strides kept
    got, want = f(cpu_x.to("tpu")), f(cpu_x)
    assert type(got) is torch.Tensor and got.device == want.device
    assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
    if want.device.type == "cpu":
        torch.testing.assert_close(got, want)
    assert torch.zeros_like(cpu_x.to("tpu")).device.type == "tpu"   # the same signature without it


def test_random_like_on_the_cpu_draws_from_the_cpu_generator():
    x = torch.randn(3, 4, device="tpu")
    torch.manual_seed(5)
    got = (torch.rand_like(x, device="cpu"), torch.randint_like(x, 7, device="cpu"))
    torch.manual_seed(5)
    want = (torch.rand_like(x.cpu()), torch.randint_like(x.cpu(), 7))
    for g, w in zip(got, want):
        assert g.device.type == "cpu"
        torch.testing.assert_close(g, w)


def test_dlpack_export_is_refused_clearly():
    """DLPack has no TPU device type: to_dlpack made a capsule whose tensor broke on use;
    every way in now raises at once and names what works (.cpu(), .jax())."""
    import numpy as np
    t = torch.randn(2, 3, device="tpu")
    for export in (torch.utils.dlpack.to_dlpack, torch.to_dlpack, torch.from_dlpack, np.from_dlpack,
                   lambda x: x.__dlpack__()):
        with pytest.raises(RuntimeError, match=r"cannot be exported through DLPack.*t\.cpu\(\)"):
            export(t)
    c = torch.randn(4)
    assert torch.equal(torch.from_dlpack(torch.utils.dlpack.to_dlpack(c)), c)   # CPU tensors as before


def test_linspace_of_tpu_scalars_follows_its_device_argument():
    """``torch.linspace(s, e, n)`` of 0-dim tpu tensors: ``device`` defaults to the CPU, as for
    every factory, and the values are read from the tensors (the signature's CPU stand-ins
    must be copies, not empty tensors)."""
    s, e = torch.tensor(-2.0), torch.tensor(3.0)
    got = torch.linspace(s.to("tpu"), e.to("tpu"), 5)
    assert got.device.type == "cpu" and torch.equal(got, torch.linspace(s, e, 5))
    on_tpu = torch.linspace(s.to("tpu"), e.to("tpu"), 5, device="tpu")
    assert on_tpu.device.type == "tpu" and torch.equal(on_tpu.cpu(), torch.linspace(s, e, 5))
