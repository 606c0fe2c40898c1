"""The next-state code: how one entry of the factored table names the state a token leads to.

    code >= 0     the next state, absolute
    code == -1    the token is illegal here
    code <= -2    relative: next = state - 2 - code (so code = -2 - (next - state))

Relative codes let states that behave alike up to a shift (deep inside a long value) share one
row of the table. This module is the one place the rule is written; the compiler encodes with
`encode_relative`, the torch and numpy maskers decode with `decode_next`/`decode_next_np`, and the
Triton kernel keeps a jitted copy of the same line that tests/test_kernels.py checks against it.
"""
from __future__ import annotations

import numpy as np
import torch

ILLEGAL = -1


def encode_relative(targets: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Relative codes for moves `states -> targets` (targets > states, so codes are <= -3)."""
    return -2 - (targets - states)


def decode_next(codes: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """int64 next states (-1 illegal) from codes and the states they were read in (broadcasting)."""
    codes = codes.long()
    return torch.where(codes >= ILLEGAL, codes, states.long() - 2 - codes)


def decode_next_np(codes: np.ndarray, states: np.ndarray) -> np.ndarray:
    """The same rule on numpy arrays (the CPU fast path works on numpy views)."""
    return np.where(codes >= ILLEGAL, codes, states - 2 - codes)
