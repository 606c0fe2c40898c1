"""
CPU fast paths of the batch masker, masking and advancing: the results of the reference (mask_torch.py) with
far less work. (Choosing tokens: choose_cpu.py.)

- Short sides: the tokens of a state split into a legal and an illegal side, and one side is short: few legal
  tokens in literal text (a key name, punctuation, a UTF-8 continuation byte), few illegal ones inside a string
  value (quotes, backslashes, control bytes, ...). Masking writes only the short side of each row.
- numpy: at B=64 a mask or an advance is ~20 small ops; numpy's per-op cost is a fraction of torch's, so they
  run on numpy views of the same memory where numpy can (float32 / float16 logits with unit stride along V).

These paths size their index lists on the host (free on the CPU).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from batchmask.kernels import gumbel, mask_torch
from batchmask.kernels.tables import Rows, Tables

from batchmask.next_codes import ILLEGAL, decode_next_np

NEG_INF = float("-inf")
_NUMPY_DTYPES = (torch.float32, torch.float16)  # bfloat16 has no numpy dtype: it takes the torch ops


# ----------------------------------------------------------------------------------------------------------
# the short sides of every state (built once per grammar)

@dataclass
class ShortSides:
    """Per distinct legal class set ("group"), the token ids of its shorter side, ascending, concatenated."""
    state_group: torch.Tensor  # int64 [S]      group of each state
    few_legal: torch.Tensor    # bool  [G]      the group lists its legal tokens (else its illegal ones)
    start: torch.Tensor        # int64 [G]      the group's tokens are tokens[start : start + length]
    length: torch.Tensor       # int64 [G]
    tokens: torch.Tensor       # int64 [T]      T = sum of the short sides
    block_legal: torch.Tensor  # bool  [G, nb]  the noise block (gumbel.NOISE_BLOCK ids) holds a legal token

    @property
    def nbytes(self) -> int:
        return sum(x.numel() * x.element_size() for x in (self.state_group, self.few_legal, self.start,
                                                           self.length, self.tokens, self.block_legal))


def gather_slices(start: torch.Tensor, length: torch.Tensor, values: torch.Tensor, label: torch.Tensor):
    """The slices values[start[k] : start[k] + length[k]] (int64 [K] each), concatenated, with the label
    (int64 [K]) of the slice each item came from -> (labels [N], items [N]).
    Item j of slice k lands at output position first[k] + j, first = exclusive cumsum of length."""
    total = int(length.sum())  # host sync: free on the CPU, and it sizes the outputs exactly
    first = length.cumsum(0) - length  # [K]
    pos = torch.repeat_interleave(start - first, length, output_size=total)  # [N] start[k] - first[k] ...
    pos += torch.arange(total, device=length.device)  # ... + (first[k] + j)
    return torch.repeat_interleave(label, length, output_size=total), values.index_select(0, pos)


def short_sides(token_class: torch.Tensor, row_next: torch.Tensor, state_row: torch.Tensor) -> ShortSides:
    """Group the states by legal class set and list each group's short side.

    Size: at most V / 2 ids per group; the default registry with the Llama 2 vocabulary has S = 4179 states in
    G = 112 groups and T = 143K ids (1.2 MB in all); per-state lists would hold 476K ids.
    """
    V, C = token_class.numel(), row_next.shape[1]
    # the tokens of one class as one contiguous slice: a group's list is then a few slices, not a V scan
    tokens_by_class = token_class.long().argsort(stable=True)  # [V]
    class_len = torch.bincount(token_class.long(), minlength=C)  # [C]
    class_start = class_len.cumsum(0) - class_len  # [C]
    sets, row_group = torch.unique(row_next != ILLEGAL, dim=0, return_inverse=True)  # [G, C], [R]
    state_group = row_group.index_select(0, state_row.long())  # [S]
    legal_tokens = (sets.long() * class_len).sum(1)  # [G]
    few_legal = legal_tokens * 2 < V  # [G]
    listed = sets == few_legal[:, None]  # [G, C] legal classes of few_legal groups, illegal ones of the others
    group, cls = listed.nonzero(as_tuple=True)  # [K] row-major: grouped by group, classes ascending
    group_of, tokens = gather_slices(class_start.index_select(0, cls), class_len.index_select(0, cls),
                                     tokens_by_class, label=group)  # [T] each
    order = (group_of * V + tokens).argsort()  # ascending ids within a group: writes walk the row forwards
    length = torch.bincount(group_of, minlength=sets.shape[0])  # [G]
    # which noise blocks hold a token of each class, then of each group's legal classes: [G, C] x [C, nb]
    nb = gumbel.num_blocks(V)
    class_blocks = torch.zeros(C, nb, dtype=torch.float32)
    class_blocks[token_class.long(), torch.arange(V) // gumbel.NOISE_BLOCK] = 1.0
    block_legal = (sets.float() @ class_blocks) > 0  # [G, nb]
    return ShortSides(state_group, few_legal, length.cumsum(0) - length, length, tokens.index_select(0, order),
                      block_legal)


def sides_of(t: Tables) -> ShortSides:
    """The tables' short sides, built on first use and kept on the tables."""
    if t.sides is None:
        t.sides = short_sides(t.token_class.cpu(), t.row_next.cpu(), t.state_row.cpu())
    return t.sides


def _np(t: Tables) -> tuple:
    cached = getattr(t, "_np", None)
    if cached is None:
        s = sides_of(t)
        cached = (t.token_class.numpy(), t.state_row.numpy(), t.row_next.numpy(),
                  *(x.numpy() for x in (s.state_group, s.few_legal, s.start, s.length, s.tokens)))
        t._np = cached
    return cached


def row_entries(rows: torch.Tensor, group: torch.Tensor, sides: ShortSides):
    """rows: int64 [k] (rows of the batch), group: int64 [B] (each row's group) -> (row, token), int64 [N]
    each, the short-side tokens of those rows in the order of rows, and length int64 [k] (entries per row)."""
    g = group.index_select(0, rows)  # [k]
    length = sides.length.index_select(0, g)  # [k]
    row, token = gather_slices(sides.start.index_select(0, g), length, sides.tokens, label=rows)
    return row, token, length


# ----------------------------------------------------------------------------------------------------------
# masking

def _mask_numpy_(logits: torch.Tensor, state: torch.Tensor, t: Tables) -> None:
    """The sparse mask on numpy views: rows with few legal tokens save them, fill with -inf and put them back;
    the others get -inf written over their few illegal tokens."""
    group_of, few_legal, start, length, tokens = _np(t)[3:]
    V, width = t.vocab_size, logits.shape[1]
    x = logits.numpy()                                             # [B, V'] a view, no copy
    stride = logits.stride(0)
    flat = x.reshape(-1) if logits.is_contiguous() else np.lib.stride_tricks.as_strided(
        x, shape=(logits.shape[0] * stride,), strides=(x.itemsize,))  # rows at r * stride
    group = group_of[state.numpy()]                                # [B]
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
    group = sides.state_group.index_select(0, state)  # [B]
    few = sides.few_legal.index_select(0, group)  # [B]
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
    return t.legal_count.index_select(0, state)  # [B]


# ----------------------------------------------------------------------------------------------------------
# advancing

def advance_(tokens: torch.Tensor, rows: Rows, t: Tables) -> None:
    """mask_torch.advance_ on numpy views of the rows' CPU buffers (same updates; numpy's per-op cost is far
    lower). Other devices or layouts take the reference."""
    if tokens.device.type != "cpu" or not all(x.is_contiguous() for x in (rows.state, rows.step, rows.history,
                                                                          rows.fault)):
        mask_torch.advance_(tokens, rows, t)
        return
    token_class, state_row, row_next = _np(t)[:3]
    V, H = t.vocab_size, rows.history.shape[1]
    tok = tokens.numpy().astype(np.int64, copy=False)                    # [B]
    state, step = rows.state.numpy(), rows.step.numpy()                  # [B] int32 views
    clamped = np.clip(tok, 0, V - 1)
    code = row_next[state_row[state], token_class[clamped]].astype(np.int64)
    nxt = decode_next_np(code, state)
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
