"""A training step's loss and gradients, computed by ``torch.compile(backend="tpu")`` with
the graph pattern rewrites on, match CPU for models whose hand-written code the rewrites
replace: Llama with eager attention (RMSNorm, rotate_half rope, SwiGLU, softmax-then-
matmul attention and the lm head's linear + cross entropy: five rewrites, ~20 s, in CI),
GPT-2 with eager attention and Cohere (interleaved rope, LayerNorm) thorough. The loss
is written outside the model, as training loops do, so the lm head meets the loss in
one graph."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import transformers as tf

from tiny import B, H, L, LLAMA_LIKE, NH, S, V, lm
from tpu_kernels import graph_patterns
from tpu_kernels.testing import tol

GPT2 = dict(n_embd=H, n_layer=L, n_head=NH, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
MODELS = {   # builder, the rewrites its step makes
    "llama_eager": (lm(tf.LlamaForCausalLM, tf.LlamaConfig, attn="eager", **LLAMA_LIKE),
                    {"rms_norm": 3, "swiglu/geglu": 1, "rope": 1, "attention": 1, "linear_cross_entropy": 1}),
    "gpt2_eager": (lm(tf.GPT2LMHeadModel, tf.GPT2Config, attn="eager", **GPT2),
                   {"attention": 1, "linear_cross_entropy": 1}),
    "cohere": (lm(tf.CohereForCausalLM, tf.CohereConfig, **LLAMA_LIKE), {"swiglu/geglu": 1, "rope": 1, "layer_norm": 2}),
}


def _loss(model, tokens):
    logits = model(input_ids=tokens).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())


def _check(name: str, monkeypatch) -> None:
    monkeypatch.delenv("TPU_KERNELS_GRAPH_PATTERNS", raising=False)
    make, want = MODELS[name]
    torch.manual_seed(0)
    cpu = make().train()
    tpu = copy.deepcopy(cpu).to("tpu")
    tokens = torch.randint(0, V, (B, S))
    before = dict(graph_patterns.REWRITES)
    torch._dynamo.reset()
    loss = torch.compile(_loss, backend="tpu")(tpu, tokens.to("tpu"))
    loss.backward()
    ref = _loss(cpu, tokens)
    ref.backward()
    done = {k: v - before.get(k, 0) for k, v in graph_patterns.REWRITES.items() if v != before.get(k, 0)}
    assert done == want, done
    t = tol(torch.float32, kernel=True)
    torch.testing.assert_close(loss.detach().cpu(), ref.detach(), **t)
    for (n, p), q in zip(tpu.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, **t, msg=lambda m, n=n: f"{name} {n}: {m}")


def test_llama_eager_step_matches_cpu(monkeypatch):
    _check("llama_eager", monkeypatch)


@pytest.mark.thorough   # ~15 s each
@pytest.mark.parametrize("name", ["gpt2_eager", "cohere"])
def test_step_matches_cpu(name, monkeypatch):
    _check(name, monkeypatch)
