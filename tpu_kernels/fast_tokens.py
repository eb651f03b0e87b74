"""Geometry tokens: a small int per tensor geometry, kept on the tensor, that the
dispatcher's FAST index keys a call on (``dispatch/run.py``), so a hot-path call reads one
attribute per tensor instead of its sizes, dtype and device.

A token names one geometry for good (tokens are never reused); two tensors of equal
geometry normally share one (a race between threads, or the table starting over, only
gives a geometry a second token: a FAST miss, never a wrong hit). ``tensor.repoint``,
the one place a tensor's geometry changes, drops its token.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch

_TOKENS: dict[tuple, int] = {}      # geometry -> its token
_NEXT_TOKEN = itertools.count()      # never reused: a token names one geometry for good
_MAX_TOKENS = 1 << 16                # the table starts over beyond this (dynamic shapes)


def fast_token(t: Any) -> int:
    """The token of tpu tensor ``t``'s geometry (sizes, dtype, device index, and for a view
    its strides and offset), now kept on it (``_tpu_fk``)."""
    st = t._tpu_storage
    g = (tuple(t.shape), t.dtype, st.index)
    if not t._tpu_direct:
        g += (tuple(t.stride()), t.storage_offset())
    tok = t._tpu_fk = _token(g)
    return tok


def direct_token(size: tuple, dtype: torch.dtype, index: int) -> int:
    """``fast_token`` of a whole-storage tensor of ``size``, ``dtype`` on tpu ``index``."""
    return _token((tuple(size), dtype, index))


def _token(g: tuple) -> int:
    tok = _TOKENS.get(g)
    if tok is None:
        if len(_TOKENS) >= _MAX_TOKENS:   # tensors keep their tokens: still unique
            _TOKENS.clear()
        tok = _TOKENS[g] = next(_NEXT_TOKEN)
    return tok
