"""The kernels a compiled training step of a real model reaches: the tiny transformers
models' ``torch.compile(backend="tpu")`` forward and backward graphs, captured and lowered
for v6e (``aot.training.kernels_used``), run RMSNorm, LayerNorm, RoPE, SwiGLU/GeGLU,
flash attention, (linear) cross entropy, the N-d linear's matmul and grouped matmul (MoE) as kernels where the
model has them: the graph pattern rewrites turn the models' hand-written code into the
kernel ops (``tpu_kernels/graph_patterns``). The eager-attention variants show the
hand-written softmax-then-matmul attention reaching flash attention; Cohere its
interleaved rotary embedding and hand-written LayerNorm. The loss is written outside the
model, as training loops do: ``F.cross_entropy`` of the lm head's logits becomes the
fused linear cross entropy, except where a float32 upcast of bf16 logits (Qwen3-MoE
here) keeps it the cross entropy kernel.

The cost model is off here: the question is which kernels the graphs reach, not whether
each beats XLA at these tiny shapes (``tests/aot/test_models_compile.py`` has that).
Lowering traces every kernel for the chip, nothing is compiled; Llama (~15 s, the model
issue 21 is about) runs in CI, the others are thorough (10-30 s each).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers as tf

from tiny import B, H, I, L, LLAMA_LIKE, NH, S, lm
from tpu_kernels import aot
from tpu_kernels.aot import graphs, training
from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry import REGISTRY

pytestmark = pytest.mark.skipif(aot.unavailable_reason() is not None, reason=str(aot.unavailable_reason()))

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu"
COMMON = {f"{FLASH}.default", f"{FLASH}_backward.default", "aten.embedding.default",
          "aten.embedding_dense_backward.default"}
# nn.Linear of [batch, seq, hidden]: the N-d linear and its weight gradient (the Pallas
# matmul); GPT-2's Conv1D is addmm of a 2-D view, whose backward is mm
LINEAR = {"tpu_kernels.linear.default", "tpu_kernels.linear_weight_grad.default"}
MM = {"aten.mm.default"}
LCE, CE = {"tpu_kernels.linear_cross_entropy.default"}, {"tpu_kernels.cross_entropy.default"}
RMS = {"aten._fused_rms_norm.default", "aten._fused_rms_norm_backward.default", "tpu_kernels.rope.default"}
LN = {"aten.native_layer_norm.default", "aten.native_layer_norm_backward.default"}
SWIGLU = {"tpu_kernels.swiglu.default", "tpu_kernels.swiglu_backward.default"}
GPT2 = dict(n_embd=H, n_layer=L, n_head=NH, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
MODELS = {   # builder, dtype, the kernel ops its step must reach
    "llama": (lm(tf.LlamaForCausalLM, tf.LlamaConfig, **LLAMA_LIKE), torch.float32, COMMON | LINEAR | RMS | SWIGLU | LCE),
    "gemma": (lm(tf.GemmaForCausalLM, tf.GemmaConfig, head_dim=8, **LLAMA_LIKE), torch.float32,
              COMMON | LINEAR | RMS | LCE | {"tpu_kernels.geglu.default", "tpu_kernels.geglu_backward.default"}),
    # torch._grouped_mm takes bf16 only
    "qwen3_moe": (lm(tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig, head_dim=8, num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=I, decoder_sparse_step=1, **LLAMA_LIKE), torch.bfloat16,
                  COMMON | LINEAR | RMS | SWIGLU | CE | {"aten._grouped_mm.default", "aten.topk.default"}),
    "gpt2": (lm(tf.GPT2LMHeadModel, tf.GPT2Config, attn="sdpa", **GPT2), torch.float32,
             COMMON | MM | LN | LCE | {"aten.addmm.default"}),
    # hand-written attention (eager_attention_forward) -> flash attention
    "llama_eager": (lm(tf.LlamaForCausalLM, tf.LlamaConfig, attn="eager", **LLAMA_LIKE), torch.float32,
                    COMMON | LINEAR | RMS | SWIGLU | LCE),
    "gpt2_eager": (lm(tf.GPT2LMHeadModel, tf.GPT2Config, attn="eager", **GPT2), torch.float32,
                   COMMON | MM | LN | LCE | {"aten.addmm.default"}),
    # interleaved rotary embedding, hand-written LayerNorm (no bias); logits scaled: no fused linear CE
    "cohere": (lm(tf.CohereForCausalLM, tf.CohereConfig, **LLAMA_LIKE), torch.float32,
               COMMON | LINEAR | LN | SWIGLU | CE | {"tpu_kernels.rope.default"}),
}
GONE = {   # hand-written ops the rewrites must have removed from the step's graphs
    "llama": {"aten.rsqrt.default", "aten.neg.default"}, "gemma": {"aten.rsqrt.default", "aten.neg.default"},
    "qwen3_moe": {"aten.rsqrt.default", "aten.neg.default"}, "gpt2": set(),
    "llama_eager": {"aten.rsqrt.default", "aten.neg.default", "aten._softmax.default"},
    "gpt2_eager": {"aten._softmax.default"}, "cohere": {"aten.neg.default", "aten.rsqrt.default"},
}


def _loss(model, tokens):     # the loss written outside the model, as training loops do
    logits = model(input_ids=tokens).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())


def _step(name: str) -> tuple[list[graphs.Graph], dict[str, dict[str, str]]]:
    """The step's captured graphs, and the kernel ops each runs on v6e."""
    make, dtype, _ = MODELS[name]
    torch.manual_seed(0)
    model = graphs.to_abstract(make().to(dtype).train())
    tokens = graphs.abstract((B, S), torch.int64)
    with REGISTRY.cost_model(False):
        with tpu_info.compile_for("v6e"):
            captured = graphs.capture(_loss, model, tokens)
        return captured, training.kernels_used(captured, "v6e")


def _check(name: str) -> None:
    captured, used = _step(name)
    assert sorted(used) == ["backward", "forward"], used
    want = MODELS[name][2]
    reached = set(used["forward"]) | set(used["backward"])
    assert want <= reached, (name, sorted(want - reached), used)
    ops = {str(n.target) for g in captured for n in g.program.gm.graph.nodes}
    assert not GONE[name] & ops, (name, sorted(GONE[name] & ops))


def test_llama_step_reaches_its_kernels():
    _check("llama")


@pytest.mark.thorough   # 10-30 s each
@pytest.mark.parametrize("name", ["gemma", "qwen3_moe", "gpt2", "llama_eager", "gpt2_eager", "cohere"])
def test_step_reaches_its_kernels(name):
    _check(name)
