"""The tpu device behaves like any torch device: factories, transfers, printing, seeds."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

import tpu_kernels
from helpers import assert_same


def test_device_module():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0
    torch.tpu.synchronize()
    assert torch.device("tpu").type == "tpu"



def test_cuda_names_code_written_for_cuda_uses():
    """``torch.cuda``'s names that training code reaches for: ``except
    torch.cuda.OutOfMemoryError`` (batch-size finders), ``torch.cuda.memory.*``,
    ``is_current_stream_capturing``; each the same on ``torch.tpu``."""
    assert torch.tpu.OutOfMemoryError is torch.OutOfMemoryError
    with pytest.raises(torch.tpu.OutOfMemoryError, match="out of memory"):
        torch.empty(2 ** 40, device="tpu")
    import torch.tpu.memory as tpu_memory
    x = torch.ones(1024, device="tpu")
    assert tpu_memory.memory_allocated() == torch.tpu.memory_allocated() >= x.nbytes
    assert torch.tpu.is_current_stream_capturing() is False
    captured = []
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        captured.append(torch.tpu.is_current_stream_capturing())
        y = x * 2
    g.replay()
    assert captured == [True] and torch.equal(y.cpu(), torch.full((1024,), 2.0))


def test_code_written_for_cuda_streams_and_data_parallel():
    """``tensor.record_stream(s)`` (side-stream copies: nothing to record, argument checked
    as torch does) and ``nn.DataParallel(model)`` on one tpu device (the module runs there;
    gradients reach CPU inputs). Both raised before (torch wants a torch.Stream; DataParallel
    split inputs with CUDA's ``torch._C._scatter``)."""
    s = torch.tpu.Stream()
    with torch.tpu.stream(s):
        y = torch.ones(3, device="tpu") * 2
    torch.tpu.current_stream().wait_stream(s)
    assert y.record_stream(torch.tpu.current_stream()) is None
    with pytest.raises(TypeError, match="must be a tpu Stream"):
        y.record_stream(0)

    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
    dp = torch.nn.DataParallel(copy.deepcopy(cpu)).to("tpu")
    x = torch.randn(5, 4, requires_grad=True)
    out = dp(x)
    assert out.device == torch.device("tpu", 0)
    assert torch.allclose(out.cpu(), cpu(x), atol=1e-6)
    out.sum().backward()
    want = torch.autograd.grad(cpu(x).sum(), x)[0]
    assert x.grad.device.type == "cpu" and torch.allclose(x.grad, want, atol=1e-6)

def test_nvtx_ranges_show_in_a_jax_profiler_trace(tmp_path):
    """``torch.tpu.nvtx`` (``torch.cuda.nvtx``'s API): pushed ranges nest and report their
    depth as NVTX's do; every range and mark is an annotation of a ``jax.profiler`` trace."""
    import glob

    import jax
    import torch.tpu.nvtx as nvtx

    with jax.profiler.trace(str(tmp_path)):
        assert (nvtx.range_push("fwd"), nvtx.range_push("inner")) == (0, 1)
        x = torch.ones(4, device="tpu") * 2
        assert (nvtx.range_pop(), nvtx.range_pop(), nvtx.range_pop()) == (1, 0, -1)
        nvtx.range_end(nvtx.range_start("loose"))
        nvtx.mark("here")
        with torch.tpu.nvtx.range("step {}", 3):
            x.sum().item()
    with pytest.raises(ValueError, match="no open range"):
        nvtx.range_end(-5)
    trace = open(glob.glob(str(tmp_path / "**" / "*.xplane.pb"), recursive=True)[0], "rb").read()
    assert all(name.encode() in trace for name in ("fwd", "inner", "loose", "here", "step 3"))

def test_amp_names_as_torch_cuda_amp():
    """``torch.tpu.amp``: what ``torch.cuda.amp`` holds (deprecated there, with the same
    warning here), each torch.amp's object for the tpu device."""
    from torch.tpu.amp import GradScaler, autocast, custom_bwd, custom_fwd

    lin = torch.nn.Linear(4, 4).to("tpu")
    x = torch.randn(2, 4).to("tpu")
    with pytest.warns(FutureWarning, match=r'torch.amp.autocast\("tpu"'):
        ctx = autocast()
    with ctx:
        assert lin(x).dtype == torch.bfloat16        # the device's autocast dtype
    with pytest.warns(FutureWarning), autocast(dtype=torch.float16):
        assert lin(x).dtype == torch.float16
    with pytest.warns(FutureWarning):
        scaler = GradScaler(init_scale=8.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 8.0

    with pytest.warns(FutureWarning):
        class Twice(torch.autograd.Function):
            @staticmethod
            @custom_fwd(cast_inputs=torch.float32)
            def forward(ctx, a):
                return a * 2

            @staticmethod
            @custom_bwd
            def backward(ctx, g):
                return g * 2
    a = torch.ones(3, dtype=torch.bfloat16).to("tpu").requires_grad_()
    with torch.autocast("tpu"):
        out = Twice.apply(a)
    assert out.dtype == torch.float32               # inputs cast as asked, autocast off inside
    out.sum().backward()
    assert a.grad.dtype == torch.bfloat16 and torch.equal(a.grad.cpu(), torch.full((3,), 2.0, dtype=torch.bfloat16))

@pytest.mark.parametrize("factory", [
    lambda d: torch.zeros(2, 3, device=d),
    lambda d: torch.ones(4, device=d, dtype=torch.int32),
    lambda d: torch.full((2, 2), 7.5, device=d),
    lambda d: torch.arange(10, device=d),
    lambda d: torch.arange(1.0, 3.0, 0.25, device=d),
    lambda d: torch.empty(0, 3, device=d).shape,
    lambda d: torch.zeros_like(torch.ones(3, device=d), dtype=torch.bfloat16),
    lambda d: torch.ones_like(torch.ones(3, device=d)),
    lambda d: torch.full_like(torch.ones(2, device=d), 3),
])
def test_factories(factory):
    expected = factory("cpu")
    got = factory("tpu")
    if isinstance(got, torch.Tensor):
        assert got.device.type == "tpu"
    assert_same(expected, got)


def _backend_compiles(fn) -> int:
    """How many XLA executables ``fn()`` compiled (``code_memory`` counts each one built)."""
    from tpu_kernels import code_memory
    assert code_memory.STATE.installed, "code_memory's compile listener is not installed"
    start = code_memory.STATE.built
    fn()
    return code_memory.STATE.built - start


def test_moving_a_new_shape_compiles_nothing():
    """``.to("tpu")`` starts with an ``empty`` of the destination: made from host zeros, not
    an XLA program per new shape and dtype."""
    xs = [torch.randn(3, 7, 11), torch.arange(13, dtype=torch.int16), torch.randn(5, 2).to(torch.bfloat16)]
    moved = []
    assert _backend_compiles(lambda: moved.extend(x.to("tpu") for x in xs)) == 0
    for x, t in zip(xs, moved):
        assert t.dtype == x.dtype and torch.equal(t.cpu(), x)


def test_a_shape_moved_every_step_compiles_its_empty_once():
    """A shape moved again and again (a loader's batch) takes the compiled ``empty`` after
    ``HOST_CALLS`` host-made ones: one compile, then calls cheaper than a host copy."""
    from tpu_kernels.runtime_ops.empty import HOST_CALLS
    x = torch.randn(3, 5, 17)
    assert _backend_compiles(lambda: [x.to("tpu") for _ in range(HOST_CALLS)]) == 0
    moved = []
    assert _backend_compiles(lambda: moved.extend(x.to("tpu") for _ in range(3))) == 1
    assert all(torch.equal(t.cpu(), x) for t in moved)


@pytest.mark.parametrize("make", [
    lambda d: torch.empty(2, 3, 4, 5, device=d, memory_format=torch.channels_last),
    lambda d: torch.empty_strided((2, 3), (1, 2), device=d),          # transposed
    lambda d: torch.empty_strided((2, 3), (4, 1), device=d),          # gaps between rows
    lambda d: torch.empty_permuted((2, 3, 4), (2, 0, 1), device=d),
    lambda d: torch.empty(0, 3, dtype=torch.bfloat16, device=d),
    lambda d: torch.empty(2048, 1024, device=d),                      # over HOST_MAX_BYTES
])
def test_empty_has_torch_layout_and_takes_writes(make):
    cpu, tpu = make("cpu"), make("tpu")
    assert (tpu.shape, tpu.stride(), tpu.dtype) == (cpu.shape, cpu.stride(), cpu.dtype)
    if cpu.numel():   # (an empty tpu tensor's storage holds one byte, as every tpu storage does)
        assert tpu.untyped_storage().nbytes() == cpu.untyped_storage().nbytes()
    src = torch.arange(cpu.numel(), dtype=torch.float32).view(cpu.shape).to(cpu.dtype)
    assert torch.equal(tpu.copy_(src).cpu(), cpu.copy_(src))
    assert torch.equal((tpu + 1).cpu(), cpu + 1)


def test_empty_of_a_dtype_jax_lacks_says_so():
    with pytest.raises(TypeError, match="has no JAX equivalent on the tpu device"):
        torch.empty(3, dtype=torch.complex32, device="tpu")
    e = torch.empty(3, dtype=torch.float8_e4m3fn, device="tpu")   # float8 has one (tests/ops/test_float8.py)
    assert e.dtype == torch.float8_e4m3fn and e.cpu().shape == (3,)


def test_transfers_and_dtypes():
    x = torch.randn(3, 4)
    t = x.to("tpu")
    assert t.device == torch.device("tpu", 0) and type(t) is tpu_kernels.TpuTensor
    assert torch.equal(t.cpu(), x)
    b = x.to("tpu", dtype=torch.bfloat16)
    assert b.dtype == torch.bfloat16 and torch.equal(b.cpu(), x.to(torch.bfloat16))
    for dt in (torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8, torch.float64):
        assert torch.equal(x.to(dt).to("tpu").cpu(), x.to(dt)), dt
    assert torch.equal(t.to(torch.int32).cpu(), x.to(torch.int32))


def test_item_tolist_print():
    t = torch.tensor([[1.5, 2.0], [3.0, -4.0]]).to("tpu")
    assert t[1, 1].item() == -4.0
    assert t.tolist() == [[1.5, 2.0], [3.0, -4.0]]
    s = repr(t)
    assert "device='tpu:0'" in s and "1.5000" in s
    assert "dtype=torch.bfloat16" in repr(t.to(torch.bfloat16))
    assert "requires_grad=True" in repr(t.clone().requires_grad_())
    assert str(torch.tensor(3).to("tpu")) == "tensor(3, device='tpu:0')"


@pytest.mark.parametrize("make", [
    lambda: torch.nn.Linear(2, 2).weight,
    lambda: torch.nn.Parameter(torch.arange(3.0), requires_grad=False),
    lambda: torch.tensor([1.5, -2.0]).to(torch.bfloat16),
    lambda: torch.tensor([1 + 2j, -0.5j]),
    lambda: torch.zeros(2, 0, dtype=torch.long),
    lambda: torch.tensor(True),
])
def test_repr_differs_from_cpu_only_by_the_device(make):
    """A tpu parameter printed without torch's 'Parameter containing:' line before."""
    torch.manual_seed(0)
    x = make()
    t = x.to("tpu") if not isinstance(x, torch.nn.Parameter) else torch.nn.Parameter(
        x.detach().to("tpu"), requires_grad=x.requires_grad)
    want = repr(x)
    got = repr(t).replace(", device='tpu:0'", "").replace("device='tpu:0', ", "")
    assert got == want and str(t) == repr(t)
    assert "Parameter" not in repr(torch.nn.Parameter(torch.ones(2, device="tpu")) * 1)


def test_tensor_from_a_list_of_tpu_scalars():
    # torch.tensor reads each element below the Python key (the device's kernel of
    # _local_scalar_dense): it raised 'Could not run aten::_local_scalar_dense'
    x, i = torch.tensor([1.5, 2.0]), torch.tensor([3, 4])
    t, ti = x.to("tpu"), i.to("tpu")
    for got, want in [(torch.tensor([t[0], t[1]]), torch.tensor([x[0], x[1]])),
                      (torch.as_tensor([1.0, t[0]]), torch.as_tensor([1.0, x[0]])),
                      (torch.tensor([ti[0], ti[1]]), torch.tensor([i[0], i[1]])),
                      (torch.tensor([ti[0] > 3]), torch.tensor([i[0] > 3])),
                      (torch.tensor([t[0]], device="tpu"), torch.tensor([x[0]]))]:
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    with torch.inference_mode():
        assert torch.equal(torch.tensor([t[1]]), torch.tensor([x[1]]))


def test_deepcopy_keeps_views_sharing_a_storage():
    # a tensor and its view copied together share the new storage, as on CPU (each was a
    # separate clone before: a write through the copied view left the copied base alone)
    import copy
    for dev in ("cpu", "tpu"):
        a = torch.tensor([[1.5, 2.0], [3.0, 4.0]], device=dev)
        a2, v2 = copy.deepcopy((a, a[0]))
        v2.fill_(0)
        assert a2.cpu().tolist() == [[0.0, 0.0], [3.0, 4.0]] and a.cpu().tolist() == [[1.5, 2.0], [3.0, 4.0]], dev
        t = torch.arange(6.0, device=dev).view(2, 3).t()
        t2 = copy.deepcopy(t)
        t2.add_(1)
        assert t2.stride() == (1, 3) and t2.cpu().tolist() == [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]
        assert t.cpu().tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    s = torch.nn.Sequential(torch.nn.Embedding(4, 2), torch.nn.Linear(2, 4, bias=False)).to("tpu")
    s[1].weight = s[0].weight
    s2 = copy.deepcopy(s)
    assert s2[0].weight is s2[1].weight and s2[0].weight is not s[0].weight


def test_views_keep_their_base_inference_state():
    # a view of an inference tensor is one outside inference mode too (it was a normal
    # tensor, so in-place updates of it and saving it for backward went through), and a
    # view of a normal tensor made under inference mode stays normal
    def run(dev):
        with torch.inference_mode():
            a = torch.ones(3, 4, device=dev)
        out = [v.is_inference() for v in (a[0], a.t(), a.view(12), a.unsqueeze(0), a[:, 1:])]
        w = torch.ones(4, 2, device=dev, requires_grad=True)
        for f in (lambda: a[0].add_(1), lambda: (a.unsqueeze(0) @ w).sum().backward()):
            with pytest.raises(RuntimeError) as e:
                f()
            out.append(str(e.value))
        b = torch.ones(3, device=dev)
        with torch.inference_mode():
            v = b[0:2]
            out.append(v.is_inference())
            v.add_(1)
        return out + [b.cpu().tolist()]
    assert run("tpu") == run("cpu")


def test_numpy_refuses_with_hint():
    with pytest.raises(TypeError, match=r"\.cpu\(\)"):
        torch.ones(2, device="tpu").numpy()


def test_mixing_devices_raises_like_torch():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(2, device="tpu") + torch.ones(2)
    # CPU scalar tensors mix, as with CUDA
    assert_same(torch.ones(2) + torch.tensor(1.0), torch.ones(2, device="tpu") + torch.tensor(1.0))


def test_copy_between_devices():
    t = torch.zeros(2, 3, device="tpu")
    t.copy_(torch.arange(6.0).reshape(2, 3))
    assert t.cpu().tolist() == [[0, 1, 2], [3, 4, 5]]
    c = torch.empty(2, 3)
    c.copy_(t)
    assert c.tolist() == [[0, 1, 2], [3, 4, 5]]
    t[0].copy_(torch.tensor([9.0, 9.0, 9.0]))
    assert t.cpu()[0].tolist() == [9, 9, 9]


def test_seed_reproducible():
    torch.manual_seed(123)
    a = torch.randn(100, device="tpu").cpu()
    torch.manual_seed(123)
    b = torch.randn(100, device="tpu").cpu()
    c = torch.randn(100, device="tpu").cpu()
    assert torch.equal(a, b) and not torch.equal(b, c)


@pytest.mark.parametrize("reentrant", [False, True])
def test_eager_checkpoint_recomputes_the_same_dropout(reentrant):
    """torch.utils.checkpoint saves the device's RNG state (only for a backend module that
    says ``_initialized``, as torch.cuda does once used) and restores it to recompute the
    region in backward: its dropout draws the forward's mask, so the gradient is zero
    exactly where the output is (HF's gradient checkpointing with dropout, eagerly)."""
    from torch.utils.checkpoint import checkpoint
    x = torch.ones(64, device="tpu", requires_grad=True)
    y = checkpoint(lambda t: torch.nn.functional.dropout(t, 0.5) * 2, x, use_reentrant=reentrant)
    y.sum().backward()
    assert 0 < (y.detach().cpu() == 0).sum() < 64
    assert torch.equal(x.grad.cpu(), y.detach().cpu())     # both 4 where kept (1 / (1 - p) * 2)


def test_pickle_roundtrip():
    t = torch.arange(4.0).to("tpu")
    u = pickle.loads(pickle.dumps(t))
    assert u.device.type == "tpu" and torch.equal(u.cpu(), t.cpu())


def test_format_of_0dim_tensor_is_its_number():
    # f"expert_{idx}" (routers keying modules by an index tensor) formats like a CUDA tensor
    idx, x = torch.tensor(3), torch.tensor(2.5)
    assert f"expert_{idx.to('tpu')}" == f"expert_{idx}" == "expert_3"
    assert f"{x.to('tpu'):.2f}" == f"{x:.2f}"
    assert f"{torch.ones(2).to('tpu')}" == str(torch.ones(2).to("tpu"))


def _trained_compiled(compile_optimizer: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("tpu")
    opt = torch.optim.AdamW(model.parameters())
    run, step = torch.compile(model, backend="tpu"), opt.step
    if compile_optimizer:
        step = torch.compile(opt.step, backend="tpu")
    for _ in range(2):
        opt.zero_grad()
        run(torch.randn(2, 8, device="tpu")).sum().backward()
        step()
    return model, opt, run


def test_a_model_that_ran_compiled_moves_again():
    # a compiled call's shadows hold weak references to the parameters, and torch refuses
    # to swap a tensor that has any (Module.to swaps tpu parameters)
    torch._dynamo.reset()
    model, opt, run = _trained_compiled(compile_optimizer=False)
    before = model[0].weight.detach().cpu().clone()
    model.to("tpu")
    model.to(torch.bfloat16)
    assert model[0].weight.dtype == torch.bfloat16 and run(torch.randn(2, 8, device="tpu", dtype=torch.bfloat16)).dtype == torch.bfloat16
    model.float()
    torch.testing.assert_close(model[0].weight.detach().cpu(), before, atol=4e-3, rtol=4e-3)
    assert model[0].weight is opt.param_groups[0]["params"][0]    # swapped in place, not replaced
    torch._dynamo.reset()


@pytest.mark.xfail(strict=True, reason="a compiled optimizer step leaves Dynamo's weakref.finalize on each "
                   "parameter, and torch refuses to swap a tensor that has weak references: the model "
                   "cannot be converted again (CUDA's plain parameters are not swapped)")
def test_a_model_whose_optimizer_ran_compiled_moves_again():
    torch._dynamo.reset()
    model, _, _ = _trained_compiled(compile_optimizer=True)
    try:
        model.to(torch.bfloat16)
    finally:
        torch._dynamo.reset()


def test_weakly_referenced_cpu_parameters_move_and_stay_tied():
    import weakref
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    model[1].weight = model[0].weight
    want = model(torch.ones(2, 4))
    held = weakref.WeakKeyDictionary({p: k for k, p in enumerate(model.parameters())})  # noqa: F841
    model.to("tpu")                # (torch cannot swap them: they get new tpu Parameters)
    assert model[0].weight is model[1].weight and model[0].weight.device.type == "tpu"
    torch.testing.assert_close(model(torch.ones(2, 4, device="tpu")).cpu(), want)


def test_an_exported_cpu_program_runs_on_tpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    exported = torch.export.export(model, (x,)).module().to("tpu")
    torch.testing.assert_close(exported(x.to("tpu")).cpu(), model(x))
