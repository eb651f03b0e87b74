"""torch.autocast("tpu") with CUDA's op lists, and torch.amp.GradScaler("tpu") (issue 20)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import tpu_kernels  # noqa: F401
from tpu_kernels.models import GPT, GPTConfig


def test_default_dtype_is_bfloat16():
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    assert torch.amp.is_autocast_available("tpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_op_lists_like_cuda(dtype):
    a, b = torch.randn(4, 8, device="tpu"), torch.randn(8, 3, device="tpu")
    lin = torch.nn.Linear(8, 3).to("tpu")
    with torch.autocast("tpu", dtype=dtype):
        assert (a @ b).dtype == dtype                   # lower-precision list
        assert lin(a).dtype == dtype
        assert torch.mm(a, b).dtype == dtype
        h = lin(a)
        assert h.softmax(-1).dtype == torch.float32      # float32 list
        assert h.exp().dtype == torch.float32
        assert h.sum().dtype == torch.float32
        assert F.layer_norm(h, (3,)).dtype == torch.float32
        assert F.mse_loss(h, torch.zeros_like(h)).dtype == torch.float32
        assert h.sum(dtype=dtype).dtype == dtype         # an explicit output dtype wins
        assert (h + 1).dtype == dtype                    # not listed: runs as given
        assert torch.addcmul(h.float(), h, h).dtype == torch.float32   # promote list
        d = torch.randn(4, 8, device="tpu", dtype=torch.float64)
        assert (d @ d.t()).dtype == torch.float64        # float64 is never cast (as CUDA)
    assert (a @ b).dtype == torch.float32                # outside: nothing changes


def test_values_match_cpu_autocast():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = lin(x)
    tl = copy.deepcopy(lin).to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        got = tl(x.to("tpu"))
        probs = got.softmax(-1)   # float32 on tpu, as on CUDA (CPU's list keeps bfloat16)
    assert got.dtype == want.dtype == torch.bfloat16 and probs.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), want, rtol=2e-2, atol=1e-2)
    torch.testing.assert_close(probs.cpu(), want.float().softmax(-1), rtol=2e-2, atol=1e-2)


def _gpt_step(model, tokens, device, scaler=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = model.loss(tokens)
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return loss.detach()


def test_gpt_mixed_precision_step_matches_cpu():
    torch.manual_seed(0)
    cfg = GPTConfig(layers=1, dim=32, heads=2, seq=16)
    cpu = GPT(cfg)
    tpu = copy.deepcopy(cpu).to("tpu")
    tokens = torch.randint(0, cfg.vocab, (2, 17))
    want = _gpt_step(cpu, tokens, "cpu")
    got = _gpt_step(tpu, tokens.to("tpu"), "tpu", torch.amp.GradScaler("tpu", init_scale=2.0**8))
    torch.testing.assert_close(got.float().cpu(), want.float(), rtol=2e-2, atol=2e-2)
    for (name, p), q in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=2e-2, atol=2e-2, msg=name)


def test_grad_scaler_unscale_and_update():
    p = torch.nn.Parameter(torch.ones(3, device="tpu"))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = torch.amp.GradScaler("tpu", init_scale=4.0, growth_interval=2)
    for step in range(2):
        opt.zero_grad()
        scaler.scale((p * 2).sum()).backward()
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 8.0                     # two clean steps: grown once
    torch.testing.assert_close(p.detach().cpu(), torch.full((3,), -3.0))
    opt.zero_grad()
    scaler.scale((p * float("inf")).sum()).backward()    # an overflow: skipped, backed off
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 4.0
    torch.testing.assert_close(p.detach().cpu(), torch.full((3,), -3.0))


def test_amp_ops_match_cpu():
    grads = [torch.tensor([1.0, 2.0]), torch.tensor([4.0, float("nan")])]
    for device_grads in ([g.clone() for g in grads], [g.to("tpu") for g in grads]):
        found = torch.zeros(1, device=device_grads[0].device)
        torch._amp_foreach_non_finite_check_and_unscale_(
            device_grads, found, torch.full((1,), 0.5, device=found.device))
        assert found.item() == 1.0
        assert device_grads[0].cpu().tolist() == [0.5, 1.0]
    scale, tracker = torch.full((1,), 2.0, device="tpu"), torch.full((1,), 1, dtype=torch.int32, device="tpu")
    torch._amp_update_scale_(scale, tracker, torch.zeros(1, device="tpu"), 2.0, 0.5, 2)
    assert scale.item() == 4.0 and tracker.item() == 0


def test_autocast_under_torch_compile():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4).to("tpu")
    x = torch.randn(2, 8, device="tpu")

    def f(x):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            h = lin(x)
            return h, h.softmax(-1)

    eager = f(x)
    compiled = torch.compile(f, backend="tpu")(x)
    assert [t.dtype for t in compiled] == [torch.bfloat16, torch.float32]
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.float().cpu(), b.float().cpu(), rtol=1e-2, atol=1e-2)


def test_binary_cross_entropy_is_refused_under_autocast_as_on_cuda():
    x = torch.rand(3, device="tpu")
    with torch.autocast("tpu"):
        with pytest.raises(RuntimeError, match="binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast"):
            torch.nn.functional.binary_cross_entropy(x, x)
        assert torch.nn.functional.binary_cross_entropy_with_logits(x, x).dtype == torch.float32
    torch.testing.assert_close(torch.nn.functional.binary_cross_entropy(x, x).cpu(),
                               torch.nn.functional.binary_cross_entropy(x.cpu(), x.cpu()))
