"""The next-state code: how one entry of the factored table names the state a token leads to.

    code >= 0     absolute: next = targets[base(state) + code], from the grammar's target list (int32 [T])
    code == -1    the token is illegal here
    code <= -2    relative: next = state - 2 - code (so code = -2 - (next - state))

Relative codes let states that behave alike up to a shift (deep inside a long value, or two equal
runs of literal text) share one row of the table. Absolute codes go through a short list so that
they stay small whatever the number of states: a grammar with 100K states has a few thousand
distinct absolute targets (explicit states, where values begin and end), so codes fit int16 and
the table costs half.

base(state): the states are cut into segments, segment k starting at state segment_start[k]
(ascending, the first 0); a state's absolute codes index the list from its segment's
segment_base[k]. Explicit states read the list from 0; each value block's cells have a segment
of their own whose part of the list is the block's exits (where the value's end leads), so
blocks alike but for where they lead (the same string type in many places, or in many tool
sets) share their rows. One segment at 0 (segment_start = segment_base = [0], or None) is the
plain list; a plain [S, C] table is the special case targets = arange(S).

This module is the one place the rule is written; the compiler encodes with `encode_relative` and
`encode_targets`/`index_targets`, the torch and numpy maskers decode with `decode_next`/`decode_next_np`, and the
Triton kernel keeps a jitted copy of the same lines that tests/test_kernels.py checks against it.
"""
from __future__ import annotations

import numpy as np
import torch

ILLEGAL = -1
SEGMENT_BITS = 20       # at most 2**20 segments: the Triton advance's binary search takes 20 halvings


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


def segment_bases(states: torch.Tensor, segment_start: torch.Tensor | None,
                  segment_base: torch.Tensor | None) -> torch.Tensor | int:
    """int64, states' shape: where each state's absolute codes start in the target list (0 without segments)."""
    if segment_start is None or segment_start.numel() <= 1:        # one segment: its base (no host sync)
        return 0 if segment_base is None or not segment_base.numel() else segment_base[0].long()
    k = torch.searchsorted(segment_start.long(), states.long(), right=True) - 1
    return segment_base.long().index_select(0, k.flatten()).view_as(k)


def decode_next(codes: torch.Tensor, states: torch.Tensor, targets: torch.Tensor,
                segment_start: torch.Tensor | None = None, segment_base: torch.Tensor | None = None) -> torch.Tensor:
    """int64 next states (-1 illegal) from codes, the states they were read in (broadcasting), and the
    grammar's target list (and its segments)."""
    codes, states = codes.long(), states.long()
    at = codes.clamp(min=0) + segment_bases(states, segment_start, segment_base)       # broadcast
    if targets.numel():
        absolute = targets.long().index_select(0, at.clamp(max=targets.numel() - 1).flatten()).view_as(at)
    else:
        absolute = torch.zeros_like(at)
    return torch.where(codes >= 0, absolute, torch.where(codes == ILLEGAL, codes, states - 2 - codes))


def segment_bases_np(states: np.ndarray, segment_start: np.ndarray | None, segment_base: np.ndarray | None):
    """The same on numpy arrays."""
    if segment_start is None or segment_start.size <= 1:
        return 0 if segment_base is None or not segment_base.size else int(segment_base[0])
    return segment_base[np.searchsorted(segment_start, states, side="right") - 1]


def decode_next_np(codes: np.ndarray, states: np.ndarray, targets: np.ndarray,
                   segment_start: np.ndarray | None = None, segment_base: np.ndarray | None = None) -> np.ndarray:
    """The same rule on numpy arrays (the CPU fast path works on numpy views)."""
    base = segment_bases_np(states, segment_start, segment_base)
    at = np.minimum(np.maximum(codes, 0) + base, max(targets.size - 1, 0))
    absolute = targets[at] if targets.size else np.zeros_like(codes)
    return np.where(codes >= 0, absolute, np.where(codes == ILLEGAL, codes, states - 2 - codes))
