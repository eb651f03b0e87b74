"""The serving engine against per-request greedy ``generate()`` on CPU: continuous
batching with chunked prefill, requests arriving between steps, eos, compiled steps (one
XLA program per token bucket, never retraced), and the Pallas kernel (interpret mode)."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf

from compiled_programs import Activity

from tpu_kernels import registry
from tpu_kernels.serving import Engine, EngineConfig

OP = "tpu_kernels.ragged_paged_attention.default"


def _model(cls=tf.LlamaForCausalLM, config=tf.LlamaConfig, eos=None, attn="sdpa", **kw):
    torch.manual_seed(0)
    size = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    cfg = config(**(size | kw), eos_token_id=eos)
    cfg._attn_implementation = attn
    return cls(cfg).eval()


def _until(tokens, eos):
    """Greedy decoding with an eos token: the same tokens, cut after the first eos."""
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def _greedy_cpu(model, prompts, n):
    return [model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)[0, len(p):]
            .tolist() for p in prompts]


def _prompts(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (n,), generator=g).tolist() for n in lengths]


def test_continuous_batching_matches_per_request_generate():
    # 5 requests through 3 sequence slots and 16-token steps: long prompts prefill in
    # chunks while others decode; the 8th token of request 3 is the eos token, so it
    # (and any other request that produces it) stops early
    model = _model()
    prompts = _prompts([5, 21, 3, 12, 9])
    greedy = _greedy_cpu(model, prompts, 20)
    eos = greedy[3][7]
    want = [_until(g, eos) for g in greedy]
    assert len(want[3]) <= 8
    engine = Engine(copy.deepcopy(model).to("tpu"), EngineConfig(
        page_size=8, num_pages=24, max_num_seqs=3, max_num_batched_tokens=16, max_model_len=48))
    with Activity() as ran:
        assert engine.generate(prompts, 20, eos_token_id=eos) == want
    # one graph per token bucket (16 tokens: steps with prefill, 3: decode-only steps),
    # each traced once; both layers' attention is the registry's ragged paged attention
    assert sum(r.calls for r in ran.ran) == engine.stats.steps and len(ran.ran) == 2
    assert all(r.program.traces == 1 and r.program.impls[(OP, "xla")] == 2 for r in ran.ran)
    assert engine.cache.allocator.num_free == 23                # every page came back


def test_requests_arrive_between_steps():
    model = _model(config=tf.Qwen3Config, cls=tf.Qwen3ForCausalLM, head_dim=16,  # q/k norms
                   num_hidden_layers=1)
    prompts = _prompts([7, 4, 10, 6], seed=2)
    want = _greedy_cpu(model, prompts, 12)
    engine = Engine(copy.deepcopy(model).to("tpu"), EngineConfig(
        page_size=4, num_pages=40, max_num_seqs=4, max_num_batched_tokens=16,
        max_model_len=32))
    reqs = [engine.add_request(p, 12) for p in prompts[:2]]
    for _ in range(3):
        engine.step()
    reqs += [engine.add_request(p, 12) for p in prompts[2:]]
    while engine.has_unfinished():
        engine.step()
    assert [r.output for r in reqs] == want


def test_pallas_kernel_in_the_engine():
    # head_dim 128 and 8-token pages: inside the kernel's limits (interpret mode off TPU)
    model = _model(hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
                   num_hidden_layers=1)
    prompts = _prompts([5, 11, 3], seed=3)
    want = _greedy_cpu(model, prompts, 6)
    engine = Engine(copy.deepcopy(model).to("tpu"), EngineConfig(
        page_size=8, num_pages=16, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=32))
    with registry.interpret(), Activity() as ran:
        assert engine.generate(prompts, 6) == want
    assert ran.ran and all(r.traces == 1 and r.program.impls.get((OP, "pallas")) == 1
                           for r in ran.ran)


def test_refuses_what_it_would_compute_wrongly():
    gemma2 = _model(tf.Gemma2ForCausalLM, tf.Gemma2Config, attn="eager", head_dim=16)
    with pytest.raises(NotImplementedError, match="gemma2"):
        Engine(gemma2, EngineConfig(compile=False))
    mistral = _model(tf.MistralForCausalLM, tf.MistralConfig, sliding_window=4)
    with pytest.raises(NotImplementedError, match="sliding_window=4"):
        Engine(mistral, EngineConfig(compile=False))
    engine = Engine(_model(num_hidden_layers=1), EngineConfig(max_model_len=16, compile=False))
    with pytest.raises(ValueError, match="exceed max_model_len=16"):
        engine.add_request([1] * 10, 8)
