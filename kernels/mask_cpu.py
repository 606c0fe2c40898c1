"""
CPU fast paths of the batch masker, masking and advancing: the results of the reference (mask_torch.py) with
far less work. (Choosing tokens: choose_cpu.py.)

- Short sides (short_sides.py): masking writes only the shorter of each row's legal and illegal sides, listed
  per table row on first use.
- numpy: at B=64 a mask or an advance is ~20 small ops; numpy's per-op cost is a fraction of torch's, so they
  run on numpy views of the same memory where numpy can (float32 / float16 logits with unit stride along V).

These paths size their index lists on the host (free on the CPU).
"""
from __future__ import annotations

import numpy as np
import torch
from batchmask.kernels import mask_torch
from batchmask.kernels.short_sides import ShortSides
from batchmask.kernels.tables import Rows, Tables, legal_counts

from batchmask.table.next_codes import decode_next_np
from batchmask.table.packed import codes_at_np

NEG_INF = float("-inf")
_NUMPY_DTYPES = (torch.float32, torch.float16)  # bfloat16 has no numpy dtype: it takes the torch ops


# ----------------------------------------------------------------------------------------------------------
# the short sides and numpy views of a table

def sides_of(t: Tables) -> ShortSides:
    """The tables' short sides (empty at first: rows are listed when a call first steps them), kept on them."""
    if t.sides is None:
        token_class, state_row, row_next, row_base, row_check = _np(t)[:3] + _np(t)[6:]
        t.sides = ShortSides(token_class, state_row, row_next, row_base, row_check, t.num_classes)
    return t.sides


def _np(t: Tables) -> tuple:
    """(token_class, state_row, row_next, targets, segment_start, segment_base, row_base, row_check) as numpy
    views (the last two None for a dense table), kept on the tables."""
    cached = getattr(t, "_np", None)
    if cached is None:
        cached = t._np = tuple(None if x is None else x.cpu().numpy()
                               for x in (t.token_class, t.state_row, t.row_next, t.targets, t.segment_start,
                                         t.segment_base, t.row_base, t.row_check))
    return cached


def row_entries(rows: torch.Tensor, group: np.ndarray, sides: ShortSides):
    """rows: int64 [k] (rows of the batch), group: int64 [B] (each row's group, from sides.groups) ->
    (row, token), int64 [N] each, the short-side tokens of those rows in the order of rows (ascending ids per
    row), and length int64 [k] (entries per row)."""
    r = rows.numpy()
    g = group[r]                                                     # [k]
    length = sides.length[g]                                         # [k]
    total = int(length.sum())
    first = np.cumsum(length) - length                               # [k]
    idx = np.repeat(sides.start[g] - first, length) + np.arange(total)  # [N] into sides.tokens
    token = sides.tokens[idx].astype(np.int64)
    return torch.from_numpy(np.repeat(r, length)), torch.from_numpy(token), torch.from_numpy(length)


# ----------------------------------------------------------------------------------------------------------
# masking

def _mask_numpy_(logits: torch.Tensor, state: torch.Tensor, t: Tables) -> None:
    """The sparse mask on numpy views: rows with few legal tokens save them, fill with -inf and put them back;
    the others get -inf written over their few illegal tokens."""
    sides = sides_of(t)
    group = sides.groups(state.numpy())                            # [B]
    few_legal, start, length, tokens = sides.few_legal, sides.start, sides.length, sides.tokens
    V, width = t.vocab_size, logits.shape[1]
    x = logits.numpy()                                             # [B, V'] a view, no copy
    stride = logits.stride(0)
    flat = x.reshape(-1) if logits.is_contiguous() else np.lib.stride_tricks.as_strided(
        x, shape=(logits.shape[0] * stride,), strides=(x.itemsize,))  # rows at r * stride
    few = few_legal[group]                                         # [B]
    rows = np.concatenate([np.flatnonzero(few), np.flatnonzero(~few)])   # keep rows first, then kill rows
    n_keep_rows = int(few.sum())
    g = group[rows]
    n = length[g]                                                  # [B] entries per row
    total = int(n.sum())
    first = np.cumsum(n) - n                                       # [B]
    idx = np.repeat(start[g] - first, n) + np.arange(total)        # [N] into tokens
    at = np.repeat(rows * stride, n) + tokens[idx]                 # [N] flat positions
    n_keep = int(n[:n_keep_rows].sum())
    keep_rows = rows[:n_keep_rows]
    saved = flat[at[:n_keep]]                                      # the few legal values
    x[keep_rows] = -np.inf                                         # whole rows, padded ids included
    flat[at[:n_keep]] = np.where(np.isnan(saved), -np.inf, saved)
    flat[at[n_keep:]] = -np.inf                                    # the few illegal ids of the other rows
    if width > V:
        x[rows[n_keep_rows:], V:] = -np.inf                        # ids the model has but the tokenizer lacks


def _mask_torch_(logits: torch.Tensor, state: torch.Tensor, t: Tables) -> None:
    """The same writes with torch ops (bfloat16, or logits without unit stride along V)."""
    sides = sides_of(t)
    V, width = t.vocab_size, logits.shape[1]
    group = sides.groups(state.numpy())  # [B]
    few = torch.from_numpy(sides.few_legal[group])  # [B]
    keep_rows, kill_rows = few.nonzero()[:, 0], (~few).nonzero()[:, 0]  # [k], [B - k]
    row, tok, length = row_entries(torch.cat([keep_rows, kill_rows]), group, sides)  # [N] keep rows first
    at = row.mul_(width).add_(tok)  # [N] take / put_ index a tensor as if flat and row-major: any strides work
    n_keep = int(length[:keep_rows.numel()].sum())
    keep_at, kill_at = at[:n_keep], at[n_keep:]  # [Nk], [Nx]
    saved = logits.take(keep_at)  # [Nk] the few legal values
    logits.index_fill_(0, keep_rows, NEG_INF)  # whole rows, padded ids included
    logits.put_(keep_at, saved.masked_fill_(torch.isnan(saved), NEG_INF))
    neg_inf = torch.tensor(NEG_INF, dtype=logits.dtype)
    logits.put_(kill_at, neg_inf.expand(kill_at.numel()))
    if width > V and kill_rows.numel():
        logits[:, V:].index_fill_(0, kill_rows, NEG_INF)  # ids the model has but the tokenizer does not


def mask_logits_(logits: torch.Tensor, state: torch.Tensor, t: Tables) -> torch.Tensor:
    """mask_torch.mask_logits_, bit for bit, writing only what must change. logits [B, V'] -> int32 [B]."""
    if logits.device.type != "cpu":
        return mask_torch.mask_logits_(logits, state, t)
    if logits.dtype in _NUMPY_DTYPES and logits.stride(1) == 1:
        _mask_numpy_(logits, state, t)
    else:
        _mask_torch_(logits, state, t)
    # a legal NaN of a many-legal row is still there: one read of the logits finds out (NaN or an overflowed
    # +inf next to the -inf make the sum NaN), and only then a pass that rewrites them
    x = logits[:, :t.vocab_size]
    if bool(torch.isnan(x.sum())):
        x.masked_fill_(torch.isnan(x), NEG_INF)
    return legal_counts(state, t)  # [B]


# ----------------------------------------------------------------------------------------------------------
# advancing

def advance_(tokens: torch.Tensor, rows: Rows, t: Tables) -> None:
    """mask_torch.advance_ on numpy views of the rows' CPU buffers (same updates; numpy's per-op cost is far
    lower). Other devices or layouts take the reference."""
    if tokens.device.type != "cpu" or not all(x.is_contiguous() for x in (rows.state, rows.step, rows.history,
                                                                          rows.fault)):
        mask_torch.advance_(tokens, rows, t)
        return
    token_class, state_row, row_next, targets, segment_start, segment_base, row_base, row_check = _np(t)
    V, H = t.vocab_size, rows.history.shape[1]
    tok = tokens.numpy().astype(np.int64, copy=False)                    # [B]
    state, step = rows.state.numpy(), rows.step.numpy()                  # [B] int32 views
    clamped = np.clip(tok, 0, V - 1)
    code = codes_at_np(row_next, row_base, row_check, state_row[state], token_class[clamped]).astype(np.int64)
    nxt = decode_next_np(code, state, targets, segment_start, segment_base)
    ok = (nxt >= 0) & (clamped == tok)
    moved = ok & (state != t.done_state)
    write = np.flatnonzero(moved & (step < H))
    rows.history.numpy()[write, step[write]] = tok[write]
    fault = rows.fault.numpy()                                           # [B, 3]
    bad = np.flatnonzero(~ok & (fault[:, 0] == 0))
    if bad.size:
        fault[bad, 0], fault[bad, 1], fault[bad, 2] = 1, tok[bad], state[bad]
    step += moved
    state[:] = np.where(ok, nxt, state)
