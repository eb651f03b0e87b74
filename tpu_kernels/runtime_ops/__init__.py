"""Ops the tpu runtime handles itself, registered as impls of kind ``runtime``
(``registry.register_runtime``): host copies and ``.item()`` (``copies``), batch norm's
hidden running-stats update (``batch_norm``), convolution results' memory format
(``conv_layout``), in-place metadata changes
(``metadata_ops``), ``empty`` made from host zeros (``empty``), small constant fills
without a launch (``constant_fills``), composite calls caught above autograd (``fused_composites``,
``rms_norm``, ``ctc_loss``), random ops recomputed by activation checkpointing (``checkpoint_rng``),
``nn.MultiheadAttention``/``nn.TransformerEncoderLayer``'s fused inference ops
(``transformer_fastpath``), every ``out=`` overload through its functional op (``out_variants``),
``torch.cond``, ``scan`` and ``map`` on tpu tensors (``control_flow``), effectful ops'
tokens in compiled graphs (``effects``), ``torch.linalg``'s error checks (``linalg_checks``), ``make_fx`` of functions closing over
real tpu tensors (``make_fx_real``: ``torch.func.linearize``).
Importing the package registers them all.
"""
from tpu_kernels.runtime_ops import (batch_norm, checkpoint_rng, constant_fills, control_flow, conv_layout, copies, ctc_loss, effects, empty,
                                     fused_composites, linalg_checks, make_fx_real, metadata_ops, out_variants, rms_norm, transformer_fastpath)

__all__ = ["batch_norm", "checkpoint_rng", "constant_fills", "control_flow", "conv_layout", "copies", "ctc_loss", "effects", "empty", "fused_composites", "linalg_checks", "make_fx_real", "metadata_ops",
           "out_variants", "rms_norm", "transformer_fastpath"]
