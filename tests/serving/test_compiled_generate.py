"""Compiled decoding: ``generate()`` with the static cache and the model's forward under
``torch.compile(backend="tpu")``. Prompts are left-padded to one bucket (with their
attention mask), so the prefill is one graph and the decode step another: each is traced
once across 64 generated tokens and a second prompt of a different length, and the
tokens equal CPU greedy decoding of the unpadded prompts. Seeded sampling reproduces."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf

from compiled_programs import Activity

from tpu_kernels import compile_step, lazy

BUCKET, NEW, CACHE = 16, 64, 128
SIZE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            eos_token_id=None, pad_token_id=0)
MODELS = {
    "llama": (tf.LlamaForCausalLM, tf.LlamaConfig, {}),
    "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config, dict(head_dim=8)),
    "gemma": (tf.GemmaForCausalLM, tf.GemmaConfig, dict(head_dim=8)),
}


def _model(name):
    cls, config, extra = MODELS[name]
    torch.manual_seed(0)
    cfg = config(**SIZE, **extra)
    cfg._attn_implementation = "sdpa"
    return cls(cfg).eval()


def _padded(ids):
    """(input_ids, attention_mask) left-padded to BUCKET tokens, on tpu."""
    pad = BUCKET - ids.shape[1]
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones_like(ids)], 1)
    return torch.cat([torch.zeros(1, pad, dtype=torch.long), ids], 1).to("tpu"), mask.to("tpu")


def _generate(model, ids, **kw):
    ids, mask = _padded(ids)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, cache_implementation="static",
                         max_cache_len=CACHE, disable_compile=True, **kw)
    return out[0, BUCKET:].cpu()


def _check(name):
    model = _model(name)
    tpu = copy.deepcopy(model).to("tpu")
    tpu.forward = torch.compile(tpu.forward, backend="tpu", dynamic=False)
    g = torch.Generator().manual_seed(1)
    compiles = lazy.stats()["compiles"]
    with Activity() as ran:
        for length in (8, 13):
            ids = torch.randint(1, 128, (1, length), generator=g)
            want = model.generate(ids, max_new_tokens=NEW, do_sample=False)[0, length:]
            assert torch.equal(_generate(tpu, ids, do_sample=False), want), (name, length)
        sampled = []
        for _ in range(2):
            torch.manual_seed(123)
            sampled.append(_generate(tpu, ids, do_sample=True))
    assert torch.equal(*sampled) and sampled[0].shape == (NEW,)
    # two graphs ran, each traced once ever (another test's model of the same shapes may
    # have traced it): the prefill (2 greedy + 2 sampled calls), the decode step (63 each)
    assert [(calls, ever) for calls, _, ever in ran.summary()] == [(4, 1), (4 * (NEW - 1), 1)]
    # the decode step's recordings never repeat (the token ids grow by one a step): after
    # compile_step.MAX_NEW_FUSIONS fused programs it runs on its own (each recording was a
    # new program compiled: 64 a generate() call, ~35,000 memory mappings, 150-225 s)
    assert lazy.stats()["compiles"] - compiles <= compile_step.MAX_NEW_FUSIONS + 2


def test_compiled_generate_llama():
    _check("llama")


@pytest.mark.thorough
@pytest.mark.parametrize("name", ["qwen3", "gemma"])
def test_compiled_generate(name):
    _check(name)


@pytest.mark.thorough
def test_transformers_own_compile_of_the_decode_step():
    # With the static cache on a tpu model, generate() compiles the decode step itself
    # (backend "tpu"); the prefill runs eagerly. Unpadded prompts of two lengths share
    # one decode graph, traced once.
    model = _model("llama")
    tpu = copy.deepcopy(model).to("tpu")
    g = torch.Generator().manual_seed(2)
    with Activity() as ran:
        for length in (8, 13):
            ids = torch.randint(1, 128, (1, length), generator=g)
            want = model.generate(ids, max_new_tokens=NEW, do_sample=False)
            got = tpu.generate(ids.to("tpu"), max_new_tokens=NEW, do_sample=False,
                               cache_implementation="static", max_cache_len=CACHE)
            assert torch.equal(got.cpu(), want), length
    assert [(calls, ever) for calls, _, ever in ran.summary()] == [(2 * (NEW - 1), 1)]
