"""The next-state code: how one entry of the factored table names the state a token leads to.

    code >= 0     absolute: next = targets[code], the grammar's list of absolute targets (int32 [T])
    code == -1    the token is illegal here
    code <= -2    relative: next = state - 2 - code (so code = -2 - (next - state))

Relative codes let states that behave alike up to a shift (deep inside a long value, or two equal
runs of literal text) share one row of the table. Absolute codes go through a short list so that
they stay small whatever the number of states: a grammar with 100K states has a few thousand
distinct absolute targets (explicit states, where values begin and end), so codes fit int16 and
the table costs half. A plain [S, C] table is the special case targets = arange(S).

This module is the one place the rule is written; the compiler encodes with `encode_relative` and
`encode_targets`/`index_targets`, the torch and numpy maskers decode with `decode_next`/`decode_next_np`, and the
Triton kernel keeps a jitted copy of the same line that tests/test_kernels.py checks against it.
"""
from __future__ import annotations

import numpy as np
import torch

ILLEGAL = -1


def encode_relative(targets: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Relative codes for moves `states -> targets` (targets > states, so codes are <= -3)."""
    return -2 - (targets - states)


def encode_targets(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes whose absolute entries are states -> (the same codes with absolute entries as indices into
    the target list, the list: int64 [T], sorted, each target once). `codes` is rewritten in place (and
    returned); pass a copy to keep it."""
    codes = codes.contiguous()
    flat = codes.view(-1)
    at = torch.nonzero(flat >= 0).flatten()                 # the absolute entries: few (most are -1)
    states = flat.index_select(0, at)
    targets = torch.unique(states.long())                   # sorted
    flat.index_copy_(0, at, index_targets(states, targets))
    return codes, targets


def index_targets(codes: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Codes whose absolute entries are states (each one of `targets`, sorted) -> the same codes with those
    entries as their indices in `targets`; -1 and relative codes as they are."""
    flat = codes.reshape(-1)
    at = torch.nonzero(flat >= 0).flatten()                 # the absolute entries: few (most are -1)
    out = flat.clone()
    out.index_copy_(0, at, torch.searchsorted(targets, flat.index_select(0, at).to(targets.dtype)).to(codes.dtype))
    return out.view_as(codes)


def decode_next(codes: torch.Tensor, states: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """int64 next states (-1 illegal) from codes, the states they were read in (broadcasting), and the
    grammar's target list."""
    codes = codes.long()
    absolute = targets.long().index_select(0, codes.clamp(min=0).flatten()).view_as(codes) \
        if targets.numel() else torch.zeros_like(codes)
    return torch.where(codes >= 0, absolute, torch.where(codes == ILLEGAL, codes, states.long() - 2 - codes))


def decode_next_np(codes: np.ndarray, states: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The same rule on numpy arrays (the CPU fast path works on numpy views)."""
    absolute = targets[np.maximum(codes, 0)] if targets.size else np.zeros_like(codes)
    return np.where(codes >= 0, absolute, np.where(codes == ILLEGAL, codes, states - 2 - codes))
