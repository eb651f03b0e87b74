"""The graph-mode bench compares like with like: the hand-written JAX GPT computes what
the torch GPT computes, and every mode runs."""
from __future__ import annotations

import numpy as np
import torch

from tpu_kernels.bench import graph_modes, jax_gpt
from tpu_kernels.models import GPT, GPTConfig


def test_jax_gpt_matches_the_torch_model():
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    tokens = torch.randint(0, cfg.vocab, (2, cfg.seq + 1))
    fwd, step = jax_gpt.jitted(cfg.layers, cfg.heads)
    params = jax_gpt.params_from(model)
    logits = fwd(params, jax_gpt.tokens_from(tokens[:, :-1]))
    np.testing.assert_allclose(np.asarray(logits), model(tokens[:, :-1]).detach().numpy(), atol=2e-5, rtol=1e-4)
    # two AdamW steps: the same losses as torch.optim.AdamW on the torch model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    state = jax_gpt.init_state(params)
    for _ in range(2):
        opt.zero_grad()
        expected = model.loss(tokens)
        expected.backward()
        opt.step()
        loss, params, state = step(params, state, jax_gpt.tokens_from(tokens))
        np.testing.assert_allclose(float(loss), expected.item(), atol=1e-5, rtol=1e-5)


def test_every_mode_runs():
    rows = graph_modes.run(["small"], iters=1, out=lambda *_: None)
    assert [r["mode"] for r in rows] == graph_modes.MODES
    assert all(r["fwd_s"] > 0 and r["step_s"] > 0 for r in rows)
