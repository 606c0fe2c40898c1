"""
Plain torch reference for the batch masker: mask, advance and sample a whole batch with a few large tensor ops.

This is both the CPU backend and the specification the Triton kernels in `mask_triton.py` must equal
(bit for bit for masking and advancing, same tokens for sampling). The grammar is a DFA over tokens, factored
by token classes and by rows of states:

    code = row_next[state_row[state], token_class[token]]
    next_state = code if code >= 0;  illegal if code == -1;  state - 2 - code if code <= -2 (relative)

(see batchmask.next_codes). A plain [S, C] table is the special case state_row = arange(S).

All functions work on any device. On the CPU, masking and (non-top-p) sampling take sparse paths that touch
only the logits that must change (the short side of each row's token set, see ShortSides); they size their
index lists on the host, which is free on the CPU. On an accelerator the dense forms run: fixed [B, V] ops,
no host sync. Both give the same results bit for bit. Names used in the shape comments:
  B rows in the batch, V grammar vocabulary, V' >= V logits width (padded ids are illegal),
  S states, C token classes, H history length (tokens remembered per row).
"""
from dataclasses import dataclass

import numpy as np
import torch
from batchmask.kernels import rng

from batchmask.next_codes import decode_next, decode_next_np


@dataclass
class Tables:
    """The compiled grammar, as the kernels read it (all on one device, contiguous). Build with make_tables."""
    token_class: torch.Tensor        # int32 [V]     class of every token id
    state_row: torch.Tensor          # int32 [S]     the row of row_next each state uses
    row_next: torch.Tensor           # int16|int32 [R, C]  next-state codes per (row, class), -1 = illegal
    legal_count: torch.Tensor        # int32 [S]     number of legal token ids per state
    class_first_token: torch.Tensor  # int64 [C]     lowest token id of each class (V for an empty class)
    sides: "ShortSides"              # the short token list of every legal class set (the CPU paths' index)
    done_state: int                  # absorbing state after EOS (only EOS legal)
    eos_id: int

    @property
    def vocab_size(self) -> int:
        return self.token_class.numel()

    @property
    def num_classes(self) -> int:
        return self.row_next.shape[1]

    @property
    def class_next(self) -> torch.Tensor:
        """int64 [S, C]: the plain table of next states (-1 illegal), decoded (for references and checks)."""
        S = self.state_row.numel()
        return decode(self.row_next.long().index_select(0, self.state_row.long()),
                      torch.arange(S, device=self.state_row.device)[:, None])


def decode(code: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Next-state codes -> next states (int64): >= 0 absolute, -1 illegal, <= -2 relative to `state`."""
    code = code.long()
    return decode_next(code, state)


def next_states(state: torch.Tensor, cls: torch.Tensor, t: Tables) -> torch.Tensor:
    """int64 [n]: the state after a token of class cls [n] from state [n] (-1 illegal)."""
    row = t.state_row.index_select(0, state).long()
    return decode(t.row_next.view(-1).index_select(0, row * t.num_classes + cls.long()), state)


def make_tables(token_class: torch.Tensor, class_next: torch.Tensor | None, legal_count: torch.Tensor,
                done_state: int, eos_id: int, state_row: torch.Tensor | None = None,
                row_next: torch.Tensor | None = None) -> Tables:
    """From a plain [S, C] table (class_next), or from the compiler's factored one (state_row, row_next)."""
    if state_row is None:
        state_row = torch.arange(class_next.shape[0], dtype=torch.int32, device=class_next.device)
        row_next = class_next
    V, C = token_class.numel(), row_next.shape[1]
    ids = torch.arange(V, device=token_class.device)
    first = torch.full((C,), V, dtype=torch.int64, device=token_class.device)
    first.scatter_reduce_(0, token_class.long(), ids, reduce="amin")  # [C]
    return Tables(token_class, state_row, row_next, legal_count, first,
                  short_sides(token_class, row_next, state_row), done_state, eos_id)


@dataclass
class Rows:
    """The per-row decoding state, resident on the device so the hot loop never syncs."""
    state: torch.Tensor    # int32 [B]     current DFA state
    step: torch.Tensor     # int32 [B]     tokens emitted so far (EOS included, repeats after done not counted)
    history: torch.Tensor  # int32 [B, H]  history[r, i] = i-th token row r emitted (i < H)
    fault: torch.Tensor    # int64 [B, 3]  first illegal advance per row: (flag 0/1, token id, state)
    key: torch.Tensor | None = None  # int64 [B]  what keys a row's random draws with (seed, key, step);
    #                                  None: the row index. Generation sets one per task, so a task's
    #                                  draws do not depend on which slot or batch size it ran in.


def row_ids(rows: Rows, start: int, count: int) -> torch.Tensor:
    """int64 [count]: the random-draw keys of rows start..start+count-1."""
    if rows.key is not None:
        return rows.key[start:start + count]
    return torch.arange(start, start + count, device=rows.state.device)


# ----------------------------------------------------------------------------------------------------------
# masking

def class_legal(state: torch.Tensor, t: Tables) -> torch.Tensor:
    """state: int32 [B] -> bool [B, C], which token classes each row may emit."""
    return t.row_next.index_select(0, t.state_row.index_select(0, state)) != -1


def legal_bound(state: torch.Tensor, t: Tables, out: torch.Tensor | None = None) -> torch.Tensor:
    """state: int32 [B] -> float32 [B, V]: +inf where the token is legal, -inf where it is illegal.

    min(logit, bound) is then the masked logit: legal values come back bit for bit (min(x, +inf) == x),
    illegal ones become -inf. Built this way because on the CPU a float32 index_select along dim 1 is
    several times faster than the same gather of a bool mask, and torch.minimum beats masked_fill_.
    """
    inf = torch.tensor(float("inf"), device=state.device)
    class_bound = torch.where(class_legal(state, t), inf, -inf)  # [B, C]
    return torch.index_select(class_bound, 1, t.token_class, out=out)  # [B, V]


def mask_logits_dense_(logits: torch.Tensor, state: torch.Tensor, t: Tables,
                       scratch: torch.Tensor | None = None) -> torch.Tensor:
    """mask_logits_ as a fixed sequence of [B, V] ops: no host sync, so it suits an accelerator (and is the
    plainest statement of the mask). A NaN logit stays NaN: torch.minimum propagates it (outside the contract).
    """
    V = t.vocab_size
    bound = legal_bound(state, t, out=scratch)  # [B, V] float32
    x = logits[:, :V]
    if x.dtype != bound.dtype:
        bound = bound.to(x.dtype)  # +-inf are exact in every float dtype; same-dtype minimum is the fast one
    torch.minimum(x, bound, out=x)
    if logits.shape[1] > V:
        logits[:, V:].fill_(float("-inf"))  # ids the model has but the tokenizer does not
    return t.legal_count.index_select(0, state)  # [B]


# The sparse (CPU) mask touches only what must change. The tokens of a state split into a legal and an
# illegal side, and one side is short: few legal tokens in literal text (a key name, punctuation, a UTF-8
# continuation byte), few illegal ones inside a string value (quotes, backslashes, control bytes, ...).
# States with the same legal class set share one list; make_tables stores the short side of each distinct set.

@dataclass
class ShortSides:
    """Per distinct legal class set ("group"), the token ids of its shorter side, ascending, concatenated."""
    state_group: torch.Tensor  # int64 [S]  group of each state
    few_legal: torch.Tensor    # bool  [G]  the group lists its legal tokens (else its illegal ones)
    start: torch.Tensor        # int64 [G]  the group's tokens are tokens[start : start + length]
    length: torch.Tensor       # int64 [G]
    tokens: torch.Tensor       # int64 [T]  T = sum of the short sides

    @property
    def nbytes(self) -> int:
        return sum(x.numel() * x.element_size()
                   for x in (self.state_group, self.few_legal, self.start, self.length, self.tokens))


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
    """Group the states by legal class set and list each group's short side (once per grammar).

    Size: at most V / 2 ids per group; the default registry with the Llama 2 vocabulary has S = 4179 states in
    G = 112 groups and T = 143K ids (1.2 MB in all); per-state lists would hold 476K ids.
    """
    V, C = token_class.numel(), row_next.shape[1]
    # the tokens of one class as one contiguous slice: a group's list is then a few slices, not a V scan
    tokens_by_class = token_class.long().argsort(stable=True)  # [V]
    class_len = torch.bincount(token_class.long(), minlength=C)  # [C]
    class_start = class_len.cumsum(0) - class_len  # [C]
    sets, row_group = torch.unique(row_next != -1, dim=0, return_inverse=True)  # [G, C], [R]
    state_group = row_group.index_select(0, state_row.long())  # [S]
    legal_tokens = (sets.long() * class_len).sum(1)  # [G]
    few_legal = legal_tokens * 2 < V  # [G]
    listed = sets == few_legal[:, None]  # [G, C] legal classes of few_legal groups, illegal ones of the others
    group, cls = listed.nonzero(as_tuple=True)  # [K] row-major: grouped by group, classes ascending
    group_of, tokens = gather_slices(class_start.index_select(0, cls), class_len.index_select(0, cls),
                                     tokens_by_class, label=group)  # [T] each
    order = (group_of * V + tokens).argsort()  # ascending ids within a group: writes walk the row forwards
    length = torch.bincount(group_of, minlength=sets.shape[0])  # [G]
    return ShortSides(state_group, few_legal, length.cumsum(0) - length, length, tokens.index_select(0, order))


def row_entries(rows: torch.Tensor, group: torch.Tensor, sides: ShortSides):
    """rows: int64 [k] (rows of the batch), group: int64 [B] (each row's group) -> (row, token), int64 [N]
    each, the short-side tokens of those rows in the order of rows, and length int64 [k] (entries per row)."""
    g = group.index_select(0, rows)  # [k]
    length = sides.length.index_select(0, g)  # [k]
    row, token = gather_slices(sides.start.index_select(0, g), length, sides.tokens, label=rows)
    return row, token, length


# numpy's per-call overhead is a few microseconds against torch's ~10-20: at B=64 the sparse mask is ~20
# small ops, so on the CPU the same algorithm runs on numpy views of the same memory where numpy can
# (float32 / float16 logits with unit stride along V; bfloat16 has no numpy dtype and takes the torch ops).
_NUMPY_DTYPES = (torch.float32, torch.float16)


def _sides_np(sides: ShortSides) -> tuple:
    cached = getattr(sides, "_np", None)
    if cached is None:
        cached = tuple(x.numpy() for x in (sides.state_group, sides.few_legal, sides.start, sides.length,
                                            sides.tokens))
        sides._np = cached
    return cached


def _mask_logits_numpy_(logits: torch.Tensor, state: torch.Tensor, t: Tables) -> None:
    """mask_logits_sparse_ on numpy views (same writes, same result bit for bit)."""
    group_of, few_legal, start, length, tokens = _sides_np(t.sides)
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
    flat[at[:n_keep]] = saved
    flat[at[n_keep:]] = -np.inf                                    # the few illegal ids of the other rows
    if width > V:
        x[rows[n_keep_rows:], V:] = -np.inf                        # ids the model has but the tokenizer lacks


def mask_logits_sparse_(logits: torch.Tensor, state: torch.Tensor, t: Tables) -> torch.Tensor:
    """mask_logits_ touching only what must change (the CPU path; a few host syncs size the index lists):
    rows with few legal tokens save them, fill with -inf and put them back; the others get -inf written over
    their few illegal tokens. Legal values are copied, never computed on, so they come back bit for bit."""
    if logits.device.type == "cpu" and logits.dtype in _NUMPY_DTYPES and logits.stride(1) == 1:
        _mask_logits_numpy_(logits, state, t)
        return t.legal_count.index_select(0, state)  # [B]
    V, width = t.vocab_size, logits.shape[1]
    group = t.sides.state_group.index_select(0, state)  # [B]
    few = t.sides.few_legal.index_select(0, group)  # [B]
    keep_rows, kill_rows = few.nonzero()[:, 0], (~few).nonzero()[:, 0]  # [k], [B - k]
    # one index build for both kinds: the keep rows' entries come first
    row, tok, length = row_entries(torch.cat([keep_rows, kill_rows]), group, t.sides)  # [N]
    at = row.mul_(width).add_(tok)  # [N] take / put_ index a tensor as if flat and row-major: any strides work
    n_keep = int(length[:keep_rows.numel()].sum())
    keep_at, kill_at = at[:n_keep], at[n_keep:]  # [Nk], [Nx]
    if n_keep:
        saved = logits.take(keep_at)  # [Nk] the few legal values
    if keep_rows.numel():
        logits.index_fill_(0, keep_rows, float("-inf"))  # whole rows, padded ids included
    if n_keep:
        logits.put_(keep_at, saved)
    neg_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    logits.put_(kill_at, neg_inf.expand(kill_at.numel()))
    if width > V and kill_rows.numel():
        logits[:, V:].index_fill_(0, kill_rows, float("-inf"))  # ids the model has but the tokenizer does not
    return t.legal_count.index_select(0, state)  # [B]


def mask_logits_(logits: torch.Tensor, state: torch.Tensor, t: Tables,
                 scratch: torch.Tensor | None = None) -> torch.Tensor:
    """In place: illegal and padded logits -> -inf, legal ones untouched. logits: [B, V'] -> int32 [B] counts.

    On the CPU the sparse form (it writes only the short side of each row, see ShortSides); elsewhere the
    dense one, which never waits for the host. Both give the same result bit for bit.
    """
    if logits.device.type == "cpu":
        return mask_logits_sparse_(logits, state, t)
    return mask_logits_dense_(logits, state, t, scratch=scratch)


# ----------------------------------------------------------------------------------------------------------
# advancing

def _tables_np(t: Tables) -> tuple:
    cached = getattr(t, "_np", None)
    if cached is None:
        cached = (t.token_class.numpy(), t.state_row.numpy(), t.row_next.numpy())
        t._np = cached
    return cached


def _advance_numpy_(tokens: torch.Tensor, rows: Rows, t: Tables) -> None:
    """advance_ on numpy views of the rows' CPU buffers (same updates; numpy's per-op cost is far lower)."""
    token_class, state_row, row_next = _tables_np(t)
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


def advance_(tokens: torch.Tensor, rows: Rows, t: Tables) -> None:
    """Move every row by its token (int [B]); an illegal token leaves the row as it was and records a fault.

    Written with few ops: at B <= 1024 each op costs its fixed overhead (~5 us), not its arithmetic.
    """
    if tokens.device.type == "cpu" and all(x.is_contiguous() for x in (rows.state, rows.step, rows.history,
                                                                        rows.fault)):
        _advance_numpy_(tokens, rows, t)
        return
    V, H = t.vocab_size, rows.history.shape[1]
    tokens = tokens.long()  # [B]
    state = rows.state  # [B] int32
    clamped = tokens.clamp(0, V - 1)  # padded / negative ids read a real column, then fail the in_vocab test
    nxt = next_states(state, t.token_class.index_select(0, clamped), t)  # [B]
    ok = (nxt >= 0) & (clamped == tokens)
    # a finished row keeps emitting EOS in place: that is not a new token of its text
    moved = ok & (state != t.done_state)

    # history[r, step[r]] = token, for rows that moved and still have room (others rewrite what is there)
    col = rows.step.clamp(max=H - 1).long()[:, None]  # [B, 1]
    write = (moved & (rows.step < H))[:, None]
    rows.history.scatter_(1, col, torch.where(write, tokens.int()[:, None], rows.history.gather(1, col)))

    # the first fault of a row is the informative one: later ones follow from it
    new_fault = ~ok & (rows.fault[:, 0] == 0)  # [B]
    if state.device.type != "cpu" or bool(new_fault.any()):  # on the CPU the check is a free sync
        record = torch.stack([torch.ones_like(tokens), tokens, state.long()], dim=1)  # [B, 3]
        rows.fault.copy_(torch.where(new_fault[:, None], record, rows.fault))

    rows.step.add_(moved)
    rows.state.copy_(torch.where(ok, nxt, state))


# ----------------------------------------------------------------------------------------------------------
# sampling

FIRST_MAX_BLOCK = 128  # ids per block in first_max: the block maxima are a vectorised amax over contiguous ids


def first_max(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scores: [b, V] (any float dtype, any strides) -> (max [b], int64 [b] the lowest index holding it).

    Equals (scores.max(1), scores.argmax(1)) for non-NaN scores, ~3x faster on the CPU, where argmax is a
    scalar loop: the block maxima come from a vectorised amax, argmax then runs over the [b, V / 128]
    maxima (the first block holding the maximum holds its first occurrence) and over that one block.
    """
    b, V = scores.shape
    blk = FIRST_MAX_BLOCK
    if V < 2 * blk:
        idx = scores.argmax(dim=1)
        return scores.gather(1, idx[:, None])[:, 0], idx
    n_full = V // blk
    block_max = scores[:, :n_full * blk].unflatten(1, (n_full, blk)).amax(dim=2)  # [b, n_full]
    if V > n_full * blk:
        block_max = torch.cat([block_max, scores[:, n_full * blk:].amax(dim=1, keepdim=True)], dim=1)
    block = block_max.argmax(dim=1)  # [b] first block holding the maximum
    base = block * blk  # [b]
    # the ids of that block; the short last block repeats its last id, which cannot come first
    ids = (base[:, None] + torch.arange(blk, device=scores.device)).clamp_(max=V - 1)  # [b, blk]
    idx = base + scores.gather(1, ids).argmax(dim=1)  # [b]
    return block_max.gather(1, block[:, None])[:, 0], idx


def first_legal_max(scores: torch.Tensor, state: torch.Tensor, t: Tables) -> torch.Tensor:
    """The chosen token of every row: the first maximum of scores (float32 [B, V], -inf where illegal).

    If every legal score is -inf (the model ruled them all out) take the first legal token; if a row has no
    legal token at all (a dead state) return EOS, which the advance then reports as illegal.
    """
    best, tok = first_max(scores)  # [B] the first maximum: ties go to the lowest id
    V = t.vocab_size
    # first legal id from the [B, C] class table, no [B, V] pass: the lowest first-token of a legal class
    first_legal = torch.where(class_legal(state, t), t.class_first_token, V).amin(dim=1)  # [B]
    fallback = torch.where(first_legal < V, first_legal, t.eos_id)
    return torch.where(best > float("-inf"), tok, fallback)


def top_p_keep(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """scores: float32 [B, V] (tempered logits, -inf illegal) -> bool [B, V], the smallest set of most
    likely tokens whose probability reaches top_p (always at least the most likely one)."""
    probs = torch.softmax(scores, dim=1)  # [B, V]
    sorted_p, order = probs.sort(dim=1, descending=True, stable=True)  # [B, V]
    mass_before = sorted_p.cumsum(dim=1) - sorted_p  # probability of the tokens ranked above
    keep_sorted = mass_before < top_p
    return torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)


def choose_tokens(logits: torch.Tensor, state: torch.Tensor, step: torch.Tensor, t: Tables,
                  temperature: float, top_p: float, seed: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Masked greedy / Gumbel-max sampling for b rows keyed by ids (default 0..b-1). logits [b, V'] -> int64 [b]."""
    V = t.vocab_size
    bound = legal_bound(state, t)  # [b, V] +inf legal, -inf illegal
    scores = logits[:, :V].float()  # [b, V] (aliases the logits when they are float32: no in-place ops)
    if temperature > 0:
        inv_t = torch.tensor(1.0 / temperature, dtype=torch.float32, device=logits.device)
        rows = torch.arange(state.numel(), device=state.device) if ids is None else ids
        noise = rng.gumbel(rng.uniforms(rng.row_keys(seed, rows, step), V))  # [b, V]
        scores = scores * inv_t
        if top_p < 1.0:
            keep = top_p_keep(torch.minimum(scores, bound), top_p)  # [b, V]
            bound = bound.masked_fill(~keep, float("-inf"))
        scores = scores.add_(noise)
    return first_legal_max(torch.minimum(scores, bound), state, t)


def segment_first_max(x: torch.Tensor, row: torch.Tensor, token: torch.Tensor, b: int) -> torch.Tensor:
    """The first maximum of each row over listed entries: x float32 [N] scores of (row, token) int64 [N].
    -> int64 [b]: per row the lowest token among its maximal scores (so the first listed token when all are
    -inf), or -1 for a row without entries."""
    none = torch.iinfo(torch.int64).max
    best = torch.full((b,), float("-inf"), device=x.device).scatter_reduce_(0, row, x, reduce="amax")  # [b]
    winner = torch.where(x == best.index_select(0, row), token, none)  # [N]
    tok = torch.full((b,), none, dtype=torch.int64, device=x.device).scatter_reduce_(0, row, winner, "amin")
    return torch.where(tok == none, -1, tok)  # [b]


def uniforms_at(keys: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """rng.uniforms at chosen (row key, token id) pairs only: keys, token int64 [N] -> float32 [N]."""
    x = rng.mix32((keys + token * rng.WEYL_STEP).bitwise_and_(rng.MASK32))  # as rng.uniforms, per pair
    return ((x >> 9).to(torch.float32) + 0.5) * rng.UNIFORM_SCALE


def choose_tokens_sparse(logits: torch.Tensor, state: torch.Tensor, step: torch.Tensor, t: Tables,
                         temperature: float, seed: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """choose_tokens without top-p, the CPU way (same tokens): rows with few legal tokens score just those;
    the others score the whole row and the illegal ids are masked only when they matter.

    Greedy, many legal: the row's first maximum, if legal, is also the first legal maximum (an equal legal
    score earlier would have come first), so only rows whose maximum is illegal pay for a masked copy.
    Sampling, many legal: the Gumbel scores are a fresh [k, V] tensor anyway; mask it in place.
    """
    V, width, b = t.vocab_size, logits.shape[1], state.numel()
    sides = t.sides
    group = sides.state_group.index_select(0, state)  # [b]
    few = sides.few_legal.index_select(0, group)  # [b]
    tok = torch.empty(b, dtype=torch.int64, device=state.device)  # [b]
    keys = None
    if temperature > 0:
        inv_t = torch.tensor(1.0 / temperature, dtype=torch.float32, device=logits.device)
        rows = torch.arange(b, device=state.device) if ids is None else ids
        keys = rng.row_keys(seed, rows, step)  # [b]

    keep_rows = few.nonzero()[:, 0]  # [k] rows scored over their legal tokens only
    if keep_rows.numel():
        row, legal, _ = row_entries(keep_rows, group, sides)  # [N]
        x = logits.take(row * width + legal).float()  # [N]
        if keys is not None:
            x = x * inv_t + rng.gumbel(uniforms_at(keys.index_select(0, row), legal))
        pick = segment_first_max(x, row, legal, b).index_select(0, keep_rows)  # [k]
        tok.index_copy_(0, keep_rows, torch.where(pick >= 0, pick, t.eos_id))  # no legal token: EOS

    dense_rows = (~few).nonzero()[:, 0]  # [b - k]
    if dense_rows.numel():
        if keys is None:
            if 2 * dense_rows.numel() >= b:  # most rows: one pass over a view beats copying them out
                first = first_max(logits[:, :V])[1].index_select(0, dense_rows)  # [m]
            else:
                first = first_max(logits[dense_rows, :V])[1]  # [m]
            nxt = next_states(state.index_select(0, dense_rows), t.token_class.index_select(0, first), t)  # [m]
            tok.index_copy_(0, dense_rows, first)
            redo = dense_rows[nxt < 0]  # the maximum is illegal: mask a copy of these rows
            if redo.numel():
                scores = logits[redo, :V].float()  # [r, V]
                mask_logits_sparse_(scores, state.index_select(0, redo), t)
                tok.index_copy_(0, redo, first_legal_max(scores, state.index_select(0, redo), t))
        else:
            u = rng.uniforms(keys.index_select(0, dense_rows), V)  # [m, V]
            scores = logits[dense_rows, :V].float().mul_(inv_t).add_(rng.gumbel(u))  # [m, V]
            mask_logits_sparse_(scores, state.index_select(0, dense_rows), t)
            tok.index_copy_(0, dense_rows, first_legal_max(scores, state.index_select(0, dense_rows), t))
    return tok


def sample_(logits: torch.Tensor, rows: Rows, t: Tables, temperature: float = 0.0, top_p: float = 1.0,
            seed: int = 0, rows_per_chunk: int | None = None, advance=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask + sample + advance the whole batch. logits [B, V'] (not modified) -> (int64 [B] tokens, int32 [B] counts).
    advance(tokens) replaces the torch advance_ (the Triton backend passes its own).

    Rows are processed in chunks so the [b, V] temporaries (scores, noise) stay a few MB even at B=1024, V=128K;
    a row's draw does not depend on the chunking (its key is (seed, rows.key or row index,
    step)). On the CPU, without top-p, each chunk takes choose_tokens_sparse (the same tokens as choose_tokens,
    far fewer [b, V] passes).
    """
    B, V = logits.shape[0], t.vocab_size
    chunk = rows_per_chunk or max(1, (1 << 22) // V)
    counts = t.legal_count.index_select(0, rows.state)  # [B] legal counts before the move
    sparse = logits.device.type == "cpu" and (top_p >= 1.0 or temperature <= 0)
    tokens = torch.cat([
        choose_tokens_sparse(logits[r:r + chunk], rows.state[r:r + chunk], rows.step[r:r + chunk], t,
                             temperature, seed, ids=row_ids(rows, r, min(chunk, B - r))) if sparse else
        choose_tokens(logits[r:r + chunk], rows.state[r:r + chunk], rows.step[r:r + chunk], t,
                      temperature, top_p, seed, ids=row_ids(rows, r, min(chunk, B - r)))
        for r in range(0, B, chunk)
    ])  # [B]
    if advance is None:
        advance_(tokens, rows, t)
    else:
        advance(tokens)
    return tokens, counts
