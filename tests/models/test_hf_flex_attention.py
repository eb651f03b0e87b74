"""A transformers model with ``attn_implementation="flex_attention"`` on tpu: Gemma-2 (tanh
soft-capped attention logits, alternating sliding-window and global layers), tiny and
random, trains and generates like the same weights on CPU with eager attention.

The tpu model's attention is torch's flex_attention (score_mod = soft-capping, block mask
from transformers' mask functions) running as fused flex HOPs: the training step on the
dense XLA impl and (``--thorough``: interpret mode is slow) on the Pallas kernels,
generation on the default impl of this machine (XLA off TPU, the kernels on a TPU).
"""
from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf

from tpu_kernels import flex_attention as tpu_flex
from tpu_kernels import registry, transformers_flex

transformers_flex.enable()


def _models():
    cfg = tf.Gemma2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          max_position_embeddings=64, attn_logit_softcapping=20.0,
                          final_logit_softcapping=30.0, sliding_window=4, query_pre_attn_scalar=16)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    cpu = tf.Gemma2ForCausalLM(cfg)
    tpu = copy.deepcopy(cpu)
    tpu.config._attn_implementation = "flex_attention"
    return cpu, tpu.to("tpu")


@pytest.fixture(scope="module")
def models():
    return _models()


@pytest.mark.parametrize("impl", ["xla", pytest.param("pallas", marks=pytest.mark.thorough)])
def test_training_step_matches_cpu(models, impl):
    cpu, tpu = models
    cpu.zero_grad(), tpu.zero_grad()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    before = dict(tpu_flex.RUNS)
    want = cpu.train()(input_ids=ids, labels=ids).loss
    want.backward()
    with registry.only("xla") if impl == "xla" else registry.interpret():
        got = tpu.train()(input_ids=ids.to("tpu"), labels=ids.to("tpu")).loss
        got.backward()
    ran = {k: n - before.get(k, 0) for k, n in tpu_flex.RUNS.items() if n > before.get(k, 0)}
    assert ran == {("flex_attention", impl): 2, ("flex_attention_backward", impl): 2}  # 2 layers
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(tpu.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=2e-5, rtol=2e-4, msg=name)


def test_generation_matches_cpu(models):
    cpu, tpu = models
    prompt = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = cpu.eval().generate(prompt, max_new_tokens=4, do_sample=False)
        got = tpu.eval().generate(prompt.to("tpu"), max_new_tokens=4, do_sample=False)
    assert torch.equal(got.cpu(), want)
