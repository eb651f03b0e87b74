"""Model forwards under ``torch.inference_mode()`` (evaluation loops, serving) match CPU.

Inference mode turns autograd's dispatch keys off, so ops torch otherwise handles above the
device reach it whole: composite ops that may copy (``to``, ``contiguous``, ``reshape``),
``detach_`` (GPT-2's attention), ``one_hot`` (MoE routers), ``item``. CI runs one model per
such path; ``--thorough`` runs every model file's forward this way.
"""
from __future__ import annotations

import pytest

import test_convnets_rnns
import test_hf_audio
import test_hf_decoders
import test_hf_encoders
import test_hf_hybrid
import test_hf_moe
import test_hf_multimodal
import test_hf_seq2seq
import test_hf_vision
from model_harness import check_forward

FILES = (test_convnets_rnns, test_hf_audio, test_hf_decoders, test_hf_encoders, test_hf_hybrid, test_hf_moe,
         test_hf_multimodal, test_hf_seq2seq, test_hf_vision)
# detach_ (GPT-2), one_hot (Qwen2-MoE's router), a padded encoder's mask cast (BERT)
IN_CI = {"gpt2", "qwen2_moe", "bert"}
CASES = [c for f in FILES for c in f.CASES]
assert IN_CI <= {c.name for c in CASES}, IN_CI - {c.name for c in CASES}


@pytest.mark.parametrize("case", [c.params("forward", c.name in IN_CI) for c in CASES])
def test_forward_under_inference_mode(case):
    check_forward(case, inference_mode=True)
