"""Activation checkpointing (per-layer rematerialisation) for a training step's graphs.

``checkpoint_layers(model)`` wraps each decoder layer of a Hugging Face model in
``torch.utils.checkpoint`` (non-reentrant), so that ``torch.compile``'s AOTAutograd
partitions the step with the layers' recomputation in the backward graph: the forward
keeps each layer's input (and what the policy below saves) instead of every activation.
The pod step (``aot.pod``, ``--remat``) captures its graphs after this, as usual.
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Recompute everything but seeded random ops (attention, whose dropout argument makes
    it one): recomputing those needs the RNG state carried from forward to backward
    (``run_with_rng_state``), which graph programs do not run; their outputs are kept."""
    if torch.Tag.nondeterministic_seeded in getattr(op, "tags", ()):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def checkpoint_layers(model: nn.Module) -> nn.Module:
    """Checkpoint every decoder layer of ``model`` (a transformers ``PreTrainedModel``
    that supports it); the model must be in training mode for the step."""
    kwargs = dict(use_reentrant=False, preserve_rng_state=False,
                  context_fn=functools.partial(create_selective_checkpoint_contexts, _policy))
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None and getattr(model, "supports_gradient_checkpointing", False):
        enable(activation_checkpointing_kwargs=kwargs)
    elif getattr(model, "supports_gradient_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(f"--remat: {type(model).__name__} has no per-layer activation "
                         "checkpointing (a transformers model with "
                         "supports_gradient_checkpointing); build it without --remat")
    return model
