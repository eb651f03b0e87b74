"""Parity of the fused attention lowerings (registry/xla/attention.py) and of
``F.scaled_dot_product_attention`` on tpu tensors with CPU torch."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same, check, to_tpu

aten = torch.ops.aten
INF = float("inf")


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _qkv(b=2, h=4, hk=4, lq=5, lk=7, e=8, dtype=torch.float32):
    return _rand(b, h, lq, e, dtype=dtype), _rand(b, hk, lk, e, dtype=dtype, seed=1), \
        _rand(b, hk, lk, e, dtype=dtype, seed=2)


def check_vs_f32(fn, *args):
    """bf16 on tpu vs torch in f32 on the same values, rounded to bf16.

    Torch's CPU flash kernel rounds the probabilities to bf16 before the second matmul and
    is off the exact result by several ulps; the lowering keeps f32 (its result is the f32
    result rounded once).
    """
    up = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args]
    expected = [e.to(torch.bfloat16) if e.dtype == torch.float32 and e.dim() == 4 else e
                for e in _as_list(fn(*up))]
    assert_same(expected, _as_list(fn(*to_tpu(args))), getattr(fn, "__name__", "fn"))


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


MASKS = {
    "none": lambda lq, lk: None,
    "additive": lambda lq, lk: _rand(lq, lk, seed=3),
    "additive_batched": lambda lq, lk: _rand(2, 1, lq, lk, seed=3),
    "neg_inf_row": lambda lq, lk: torch.zeros(lq, lk).index_fill_(0, torch.tensor([1]), -INF),
}


# -- the op the CPU records ---------------------------------------------------------------------
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_flash_for_cpu_forward_backward(causal, mask, kv_heads):
    q, k, v = _qkv(hk=kv_heads)
    m = MASKS[mask](5, 7)
    out, lse = check(lambda q, k, v, m: aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=m, scale=None if mask == "none" else 0.4), q, k, v, m)
    o, l = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=m,
                                                            scale=None if mask == "none" else 0.4)
    go = _rand(*o.shape, seed=4)
    check(lambda go, q, k, v, o, l, m: aten._scaled_dot_product_flash_attention_for_cpu_backward(
        go, q, k, v, o, l, 0.0, causal, attn_mask=m, scale=None if mask == "none" else 0.4),
        go, q, k, v, o, l, m)


def test_flash_for_cpu_bf16_and_odd_sizes():
    q, k, v = _qkv(b=1, h=3, hk=1, lq=9, lk=3, e=5, dtype=torch.bfloat16)
    check_vs_f32(lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True),
                 q, k, v)
    q, k, v = _qkv(b=1, h=2, hk=2, lq=1, lk=1, e=3)
    check(lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v), q, k, v)


def test_flash_for_cpu_refuses_dropout():
    q, k, v = to_tpu(_qkv())
    with pytest.raises(Exception, match="dropout"):
        aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.1)


# -- F.scaled_dot_product_attention on tpu tensors (whichever ATen ops it reaches) -------------------
SDPA_CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "bool_mask": dict(mask="bool"),
    "additive_mask": dict(mask="additive"),
    "scale": dict(scale=0.3, is_causal=True),
}


@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_end_to_end(case, gqa):
    kw = dict(SDPA_CASES[case])
    kind = kw.pop("mask", None)
    q, k, v = (t.requires_grad_() for t in _qkv(hk=2 if gqa else 4, lq=6, lk=6))
    m = None
    if kind == "bool":
        m = _rand(6, 6, seed=5) > -0.5
        m[:, 0] = True
    elif kind == "additive":
        m = _rand(2, 1, 6, 6, seed=5)
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=gqa, **kw),
          q, k, v, m, grad=True)


def test_sdpa_bf16_forward():
    q, k, v = _qkv(lq=6, lk=6, dtype=torch.bfloat16)
    check_vs_f32(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)


# -- CUDA / PrivateUse1 variants (recorded elsewhere): against CPU torch's SDPA and its grads ------------
def _reference(q, k, v, bias, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    b = bias.detach().requires_grad_() if bias is not None else None
    mask = b
    if causal and b is not None:  # torch's SDPA takes a mask or is_causal, not both
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        mask, causal = b.masked_fill(~keep, -INF), False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    go = _rand(*out.shape, seed=4)
    grads = torch.autograd.grad(out, [q, k, v] + ([b] if b is not None else []), go)
    return out.detach(), go, grads


@pytest.mark.parametrize("causal", [False, True])
def test_flash_cuda_variant(causal):
    q, k, v = _qkv(lq=6, lk=6)
    out, go, (dq, dk, dv) = _reference(q, k, v, None, causal)
    tq, tk, tv, tgo = to_tpu((q, k, v, go))
    r = aten._scaled_dot_product_flash_attention(tq, tk, tv, 0.0, causal)
    assert_same(out, r[0], "flash out")
    assert (r[4], r[5]) == (6, 6)
    g = aten._scaled_dot_product_flash_attention_backward(tgo, tq, tk, tv, r[0], r[1], r[2], r[3], r[4], r[5],
                                                          0.0, causal, r[6], r[7])
    assert_same([dq, dk, dv], list(g), "flash grads")


@pytest.mark.parametrize("causal", [False, True])
def test_efficient_variant_with_bias_grad(causal):
    q, k, v = _qkv(lq=5, lk=7)
    bias = _rand(2, 4, 5, 7, seed=6)
    out, go, (dq, dk, dv, db) = _reference(q, k, v, bias, causal)
    tq, tk, tv, tb, tgo = to_tpu((q, k, v, bias, go))
    r = aten._scaled_dot_product_efficient_attention(tq, tk, tv, tb, True, 0.0, causal)
    assert_same(out, r[0], "efficient out")
    g = aten._scaled_dot_product_efficient_attention_backward(tgo, tq, tk, tv, tb, r[0], r[1], r[2], r[3], 0.0,
                                                              [True] * 4, causal)
    assert_same([dq, dk, dv, db], list(g), "efficient grads")


def test_overrideable_variant():
    q, k, v = _qkv(lq=5, lk=7)
    bias = _rand(2, 4, 5, 7, seed=6)
    out, go, (dq, dk, dv, db) = _reference(q, k, v, bias, False)
    tq, tk, tv, tb, tgo = to_tpu((q, k, v, bias, go))
    r = aten._scaled_dot_product_fused_attention_overrideable(tq, tk, tv, tb)
    assert_same(out, r[0], "overrideable out")
    g = aten._scaled_dot_product_fused_attention_overrideable_backward(
        tgo, tq, tk, tv, tb, [True] * 4, r[0], r[1], r[2], r[3], r[4], r[5], 0.0, False, r[6], r[7])
    assert_same([dq, dk, dv, db], list(g), "overrideable grads")


# -- value head dim != query/key head dim (multi-head latent attention: DeepSeek-V2/V3) --------------
@pytest.mark.parametrize("mask,causal,kv_heads", [("none", False, 4), ("none", True, 2),
                                                  ("additive_batched", False, 4)])
def test_sdpa_value_head_dim_differs(mask, causal, kv_heads):
    q, k, _ = _qkv(hk=kv_heads, lq=6, lk=6, e=12)
    v = _rand(2, kv_heads, 6, 16, seed=5)
    m = MASKS[mask](6, 6)
    gqa = kv_heads != 4
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                                            enable_gqa=gqa),
          q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), m, grad=True)


def test_flash_for_cpu_refuses_value_head_dim_like_cpu():
    # torch's CPU flash kernel requires one head size; its meta function does not check
    q, k = _rand(2, 4, 6, 12), _rand(2, 4, 6, 12, seed=1)
    v = _rand(2, 4, 6, 16, seed=2)
    with pytest.raises(RuntimeError) as cpu:
        aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    with pytest.raises(RuntimeError) as tpu:
        aten._scaled_dot_product_flash_attention_for_cpu(*to_tpu((q, k, v)))[0].cpu()
    assert str(cpu.value) in str(tpu.value)


def test_pallas_flash_attention_refuses_value_head_dim_with_reason():
    from tpu_kernels.registry import REGISTRY
    op = aten._scaled_dot_product_flash_attention_for_cpu.default
    q, k = torch.empty(2, 4, 128, 64, device="meta"), torch.empty(2, 4, 128, 64, device="meta")
    v = torch.empty(2, 4, 128, 128, device="meta")
    pallas = [i for i in REGISTRY.impls(op) if i.kind == "pallas"]
    assert pallas and "value head_dim" in pallas[0].check(q, k, v)
    assert pallas[0].check(q, k, torch.empty(2, 4, 128, 64, device="meta")) is None


def _masks(kind: str, b: int, l: int):
    """(attn_mask [l, l], key_padding_mask [b, l]) of a kind: none, padding, causal, both, float."""
    causal = torch.triu(torch.ones(l, l, dtype=torch.bool), 1)
    pad = torch.zeros(b, l, dtype=torch.bool)
    pad[0, l - 2:] = True
    return {"none": (None, None), "padding": (None, pad), "causal": (causal, None), "both": (causal, pad),
            "float": (causal.float() * -1e4, None)}[kind]


@pytest.mark.parametrize("masks", ["none", "padding", "causal", "both", "float"])
@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_inference_fast_path(masks, norm_first, activation):
    """``nn.TransformerEncoderLayer`` in eval mode without autograd takes torch's fast path
    (``aten._transformer_encoder_layer_fwd``, its attention ``_native_multi_head_attention``)
    on tpu as on CPU: the same outputs for every mask kind and both layer layouts."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation=activation, batch_first=True,
                                             norm_first=norm_first).eval()
    tpu = copy.deepcopy(layer).to("tpu")
    x = _rand(2, 6, 16)
    attn_mask, pad = _masks(masks, 2, 6)
    def on(t):
        return None if t is None else t.to("tpu")
    with torch.inference_mode():
        want = layer(x, src_mask=attn_mask, src_key_padding_mask=pad)
        got = tpu(x.to("tpu"), src_mask=on(attn_mask), src_key_padding_mask=on(pad))
    assert_same(want, got, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("average", [True, False])
def test_multihead_attention_inference_fast_path(average):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    tpu = copy.deepcopy(mha).to("tpu")
    q, kv = _rand(2, 5, 16), _rand(2, 7, 16, seed=1)
    _, pad = _masks("padding", 2, 7)
    with torch.no_grad():
        want = mha(q, kv, kv, key_padding_mask=pad, average_attn_weights=average)
        got = tpu(q.to("tpu"), kv.to("tpu"), kv.to("tpu"), key_padding_mask=pad.to("tpu"),
                  average_attn_weights=average)
        assert_same(want[0], got[0], atol=1e-5, rtol=1e-5)
        assert_same(want[1], got[1], atol=1e-5, rtol=1e-5)
        assert tpu(q.to("tpu"), kv.to("tpu"), kv.to("tpu"), need_weights=False)[1] is None


@pytest.mark.parametrize("padding", ["left aligned", "not left aligned", "float"])
def test_transformer_encoder_nested_path_runs_padded(padding):
    """``nn.TransformerEncoder`` in eval mode with a padding mask packs the batch into a
    nested tensor on CPU and CUDA; on tpu it runs the layers on the padded batch: the same
    outputs, padded positions (zero before the final norm) included."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(16)).eval()
    tpu = copy.deepcopy(encoder).to("tpu")
    x = _rand(3, 6, 16)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[0, 4:] = True
    pad[2, 1:] = True
    if padding == "not left aligned":     # torch's own check sends this one down the padded path
        pad[1, 0] = True
    mask = pad.float() * -1e9 if padding == "float" else pad
    with torch.no_grad():
        want = encoder(x, src_key_padding_mask=mask)
        got = tpu(x.to("tpu"), src_key_padding_mask=mask.to("tpu"))
    assert_same(want, got, atol=1e-5, rtol=1e-5)


def test_nested_tensor_from_mask_left_aligned_matches_cpu():
    t = torch.zeros(2, 2, 4)
    for rows in ([[1, 1], [1, 0]], [[0, 0], [0, 1]], [[0, 0], [1, 1]], [[1, 0], [0, 1]], [[0, 1], [1, 1]]):
        mask = torch.tensor(rows, dtype=torch.bool)
        assert torch._nested_tensor_from_mask_left_aligned(t.to("tpu"), mask.to("tpu")) == \
            torch._nested_tensor_from_mask_left_aligned(t, mask), rows
    with pytest.raises(RuntimeError, match="Mask size should match input size"):
        torch._nested_tensor_from_mask_left_aligned(t.to("tpu"), torch.ones(2, 3, dtype=torch.bool, device="tpu"))
    with pytest.raises(RuntimeError, match="Expected mask to be of ScalarType Bool, but got Float"):
        torch._nested_tensor_from_mask_left_aligned(t.to("tpu"), torch.ones(2, 2, device="tpu"))
    with pytest.raises(NotImplementedError, match="nested tensors are not supported on the tpu device"):
        torch._nested_tensor_from_mask(t.to("tpu"), torch.ones(2, 2, dtype=torch.bool, device="tpu"))
