"""Byte DFA x vocabulary -> the token table: next_state[s, t] for every state and token.

The table is the artifact everything stands on. Stored plainly, S x V int32 for the default
registry on a 32000-token vocabulary would be hundreds of MB; but almost all columns repeat.
Two tokens whose columns are equal everywhere can share one, so the table is stored as

    token_class  int32 [V]      the column each token uses
    class_next   int16 [S, C]   next state (-1 = illegal); int32 if S does not fit in int16

with C in the low hundreds: kept dense on the device, so a decoding step is two gathers.

How the columns are found without ever building S x V:
  * literal states (a few hundred) are simulated byte by byte, but only on the tokens that
    survive their first byte (grouped by first byte), so the work is the number of live
    (state, token) pairs, not S x V;
  * value states are regular: from (n, u) a token either stays inside the value (its leading
    run of body bytes is all of it: n grows by its length, u moves by its UTF-8 effect) or
    closes the value at its first quote and the rest of it runs from the literal after that
    quote, or is illegal. So a token's behaviour on every value state is fixed by a short
    signature: (kind, run length, UTF-8 effect per sub-state, result after the quote).
Tokens with equal signatures (and equal literal columns) get one class; the table is then
filled for one representative per class, and equal columns are merged once more at the end.
"""
from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from . import utf8 as U
from .dfa import ByteDFA, build_byte_dfa, byte_table
from .grammar import QUOTE, tool_paths
from .next_codes import decode_next, encode_relative
from .registry import ToolRegistry

CACHE_FORMAT = "batchmask-grammar/2"

# Value-state signature kinds of a token.
_EMPTY, _BODY, _CLOSES, _BREAKS = 0, 1, 2, 3


class GrammarCacheError(ValueError):
    """A compiled-grammar cache file is corrupt or was built for something else."""


class FlatVocab:
    """The vocabulary as one byte string: token t is flat[offset[t] : offset[t] + length[t]].

    Work is then proportional to the total bytes of the vocabulary, not V x (longest token).
    """

    def __init__(self, token_bytes: list[bytes], device):
        lengths = np.fromiter((len(b) for b in token_bytes), dtype=np.int64, count=len(token_bytes))
        joined = b"".join(token_bytes) + b"\0"                    # one pad byte: reads past a token stay in range
        self.flat = torch.from_numpy(np.frombuffer(joined, dtype=np.uint8).astype(np.int64)).to(device)  # [N+1]
        self.lengths = torch.from_numpy(lengths).to(device)                                              # [V]
        self.offset = torch.cumsum(self.lengths, 0) - self.lengths                                       # [V]
        self.max_len = int(lengths.max(initial=0))
        self.owner = torch.repeat_interleave(torch.arange(len(token_bytes), device=device), self.lengths)  # [N]
        self.pos = torch.arange(len(self.owner), device=device) - self.offset[self.owner]                # [N]

    def __len__(self) -> int:
        return self.lengths.shape[0]

    def byte_at(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.flat[self.offset[tok] + pos]


def _run_tokens(delta: torch.Tensor, vocab: FlatVocab,
                start: torch.Tensor, tok: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Feed token `tok[p]` from byte `offset[p]` on, starting in state `start[p]`.

    delta int64 [S, 256]; start/tok/offset int64 [P]. Returns int64 [P]: the state after the
    token's last byte, or -1. Only live pairs are carried from one byte to the next.
    """
    lengths = vocab.lengths
    out = torch.full_like(start, -1)
    idx = torch.arange(len(start), device=start.device)
    state, pos = start.clone(), offset.clone()
    ended = pos >= lengths[tok]                    # nothing left to feed: stays where it is
    out[idx[ended]] = state[ended]
    live = ~ended & (state >= 0)
    idx, state, pos, t = idx[live], state[live], pos[live], tok[live]
    while len(idx):
        state = delta[state, vocab.byte_at(t, pos)]
        pos = pos + 1
        fin = pos >= lengths[t]
        out[idx[fin]] = state[fin]
        keep = ~fin & (state >= 0)
        idx, state, pos, t = idx[keep], state[keep], pos[keep], t[keep]
    return out


def _literal_columns(dfa: ByteDFA, delta: torch.Tensor, vocab: FlatVocab):
    """Where each token leads from each literal state, as sparse (state, token, next) triples.

    Only tokens whose first byte is one a literal state accepts are simulated: the pairs are
    built per (literal state, accepted byte) edge from tokens grouped by first byte.
    """
    dev = vocab.flat.device
    lengths = vocab.lengths
    first = torch.where(lengths > 0, vocab.flat[vocab.offset], torch.full_like(lengths, 256))
    order = torch.argsort(first, stable=True)                    # tokens grouped by first byte
    counts = torch.bincount(first, minlength=257)[:256]          # [256]
    starts = torch.cumsum(counts, 0) - counts
    edges = torch.tensor([(s, b, t) for (s, b), t in dfa.lit_edges.items()], dtype=torch.int64,
                         device=dev).reshape(-1, 3)
    n_per_edge = counts[edges[:, 1]]                             # [E]
    edge_of_pair = torch.repeat_interleave(torch.arange(len(edges), device=dev), n_per_edge)
    rank = torch.arange(len(edge_of_pair), device=dev) - torch.repeat_interleave(
        torch.cumsum(n_per_edge, 0) - n_per_edge, n_per_edge)
    tok = order[starts[edges[edge_of_pair, 1]] + rank]           # [P]
    src = edges[edge_of_pair, 0]
    nxt = _run_tokens(delta, vocab, edges[edge_of_pair, 2], tok, torch.ones_like(tok))
    ok = nxt >= 0
    return src[ok], tok[ok], nxt[ok]


def _value_signature(dfa: ByteDFA, delta, vocab: FlatVocab, body: torch.Tensor):
    """Per token: kind, run length, UTF-8 effect [Ub, V], and the state after a closing quote per block."""
    dev = vocab.flat.device
    V, lengths = len(vocab), vocab.lengths
    Ub = body.shape[0]
    flat = vocab.flat[:-1]                                                   # [N] bytes of all tokens
    is_body = (body >= 0).any(0)                                             # [256]
    # leading body bytes = position of the token's first non-body byte (its length if none)
    breaks = ~is_body.index_select(0, flat)                                  # [N]
    run = lengths.clone().scatter_reduce_(0, vocab.owner[breaks], vocab.pos[breaks], reduce="amin")
    stop = vocab.flat[vocab.offset + run]                                    # [V] byte after the run (pad if none)
    kind = torch.where(lengths == 0, _EMPTY,
                       torch.where(run == lengths, _BODY,
                                   torch.where(stop == QUOTE, _CLOSES, _BREAKS)))
    # UTF-8 effect of the run from every sub-state: [Ub, V], -1 if the run is not well formed.
    # An empty run changes nothing; an ASCII run is legal only between characters and ends
    # between characters. Only runs holding bytes >= 0x80 need the automaton.
    eff = torch.where(run[None, :] == 0, torch.arange(Ub, device=dev)[:, None],
                      torch.where(torch.arange(Ub, device=dev)[:, None] == U.BOUNDARY, U.BOUNDARY, -1))
    if Ub > 1:
        in_run_high = (flat >= 0x80) & (vocab.pos < run[vocab.owner])      # [N]
        needs = torch.zeros(V, dtype=torch.bool, device=dev).index_fill_(0, vocab.owner[in_run_high], True)
        high = torch.nonzero(needs).flatten()                                # tokens that need the automaton
    if Ub > 1 and len(high):
        # sub-state Ub stands for "dead" and stays dead, so the loop needs no masking
        table = torch.cat([torch.where(body >= 0, body, Ub), torch.full((1, 256), Ub, dtype=body.dtype, device=dev)])
        flat_table = table.reshape(-1)                                                   # [(Ub+1) * 256]
        hrun = run[high]
        hoff = vocab.offset[high]                                                      # [H]
        H = len(high)
        # (start sub-state, token) pairs, dropped as soon as they die or their run ends:
        # from a mid-character start most tokens die on their first byte.
        start = torch.arange(Ub, device=dev).repeat_interleave(H)                      # [P]
        tk = torch.arange(H, device=dev).repeat(Ub)                                    # [P]
        cur = start.clone()
        eff[:, high] = -1
        i = 0
        while len(cur):
            ended = hrun[tk] <= i
            eff[start[ended], high[tk[ended]]] = cur[ended]
            start, tk, cur = start[~ended], tk[~ended], cur[~ended]
            cur = flat_table.index_select(0, cur * 256 + vocab.flat[hoff[tk] + i])
            alive = cur < Ub
            start, tk, cur = start[alive], tk[alive], cur[alive]
            i += 1
    # After a closing quote the token's remainder runs from the block's post-quote state.
    closers = torch.nonzero(kind == _CLOSES).flatten()
    after = torch.full((len(dfa.blocks), V), -1, dtype=torch.int64, device=dev)
    for k, blk in enumerate(dfa.blocks):     # a loop over blocks (a handful), not over tokens
        after[k, closers] = _run_tokens(delta, vocab, torch.full_like(closers, blk.after_quote), closers,
                                        run[closers] + 1)
    return kind, run, eff, after


def _value_rows(dfa: ByteDFA, kind, run, eff, after, dev, far_depth=None):
    """Next state from value states for C class representatives.

    Returns (state ids [N], rows int64 [N, C], within bool [N, C]): `within` marks moves that
    stay inside the value (the only ones whose target is a fixed shift of the state).

    With `far_depth`, the states of each block that are `far` (see _far_mask) are represented by
    the first of them per sub-state; the rest are skipped (they share its row, shifted).
    """
    Ub = dfa.num_substates
    pending = torch.as_tensor(U.PENDING[:Ub], device=dev)
    stays_kind = (kind == _BODY)[None, :]                                     # [1, C]
    closes_kind = (kind == _CLOSES)[None, :]                                  # [1, C]
    ids_out, rows, within = [], [], []
    for k, blk in enumerate(dfa.blocks):     # a loop over blocks (a handful)
        far = _far_mask(blk, far_depth, dev)
        us_all = torch.as_tensor(blk.us, device=dev)
        keep = ~far
        if bool(far.any()):                  # keep the first far state of each sub-state
            idx = torch.arange(len(far), device=dev)
            first = torch.full((Ub,), len(far), dtype=torch.int64, device=dev)
            first.scatter_reduce_(0, us_all[far], idx[far], reduce="amin")
            keep[first[first < len(far)]] = True
        sel = torch.nonzero(keep).flatten()
        ns = torch.as_tensor(blk.ns, device=dev)[sel][:, None]               # [Nb, 1]
        us = us_all[sel]                                                     # [Nb]
        grid = torch.as_tensor(blk.grid, device=dev).reshape(-1)             # [(max+1) * Ub]
        e = eff.index_select(0, us)                                          # [Nb, C] sub-state after the run
        ec = e.clamp(min=0)
        n2 = ns + run[None, :]                                               # [Nb, C] bytes after the run
        # Stays in the value: well formed, and its last character fits under the cap.
        end = n2 + pending.index_select(0, ec.reshape(-1)).view_as(ec)
        stays = stays_kind & (e >= 0) & (end <= blk.max)
        inside = grid.index_select(0, (n2.clamp(max=blk.max) * Ub + ec).reshape(-1)).view_as(n2)
        # Closes the value: at a character boundary, with the minimum met, then the rest fits.
        closes = closes_kind & (e == U.BOUNDARY) & (n2 >= blk.min) & (n2 <= blk.max) & (after[k] >= 0)[None, :]
        out = torch.where(stays, inside, -1)
        rows.append(torch.where(closes, after[k][None, :], out))
        ids_out.append(blk.base + sel)
        within.append(stays)
    if not rows:
        return (torch.empty(0, dtype=torch.int64, device=dev),
                torch.empty((0, kind.shape[0]), dtype=torch.int64, device=dev),
                torch.empty((0, kind.shape[0]), dtype=torch.bool, device=dev))
    return torch.cat(ids_out), torch.cat(rows), torch.cat(within)


def _classes_of(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Group equal rows of int64 [V, K]: (class id per row [V], first row of each class [C]).

    `torch.unique(dim=0)` sorts rows lexicographically and is slow (~0.1 s for 32000 rows
    here), so each row is first folded into two exact integer dot products with random
    weights (no overflow: the bound is checked) and grouped by a 1-D unique; then every row
    is compared with its class's first row, and only if a collision shows up do we pay for
    the exact row sort.
    """
    dev = keys.device
    V, K = keys.shape
    if V == 0:
        return torch.zeros(0, dtype=torch.int64, device=dev), torch.zeros(0, dtype=torch.int64, device=dev)
    shifted = keys - keys.min()                                   # [V, K] >= 0
    top = int(shifted.max()) + 1
    gen = torch.Generator().manual_seed(K)
    weights = torch.randint(1, 1 << 20, (K, 2), generator=gen).to(dev)
    if top * (1 << 20) * K < (1 << 62) and K > 1:
        # exact int64 dot products (CPU int64 matmul has no fast path: multiply and sum instead)
        h = torch.stack([(shifted * weights[:, j]).sum(1) for j in range(2)], 1)        # [V, 2]
        key1d = h[:, 0] * (1 << 21) + torch.remainder(h[:, 1], 1 << 21) if int(h.max()) < (1 << 41) \
            else h[:, 0] ^ (h[:, 1] << 17)
        _, inverse = torch.unique(key1d, return_inverse=True)
    else:
        _, inverse = torch.unique(keys[:, 0] if K == 1 else keys, dim=None if K == 1 else 0, return_inverse=True)
    rep = _first_of_each(inverse)
    if not torch.equal(keys, keys[rep[inverse]]):                # a hash collision: do it exactly
        _, inverse = torch.unique(keys, dim=0, return_inverse=True)
        rep = _first_of_each(inverse)
    return inverse, rep


def _first_of_each(inverse: torch.Tensor) -> torch.Tensor:
    C = int(inverse.max()) + 1
    rep = torch.full((C,), len(inverse), dtype=torch.int64, device=inverse.device)
    return rep.scatter_reduce_(0, inverse, torch.arange(len(inverse), device=inverse.device), reduce="amin")


def compile_grammar(registry: ToolRegistry, tokenizer, max_string: int = 256, utf8: bool = True,
                    device="cpu") -> CompiledGrammar:
    """Compile `registry` against `tokenizer`'s vocabulary into a CompiledGrammar on `device`.

    `tokenizer` needs `token_bytes` (list[bytes], b"" for ids with no text), `eos_id`, and
    optionally `vocab_hash()`.
    """
    dev = torch.device(device)
    if dev.type != "cpu":
        return _compile(registry, tokenizer, max_string, utf8, dev)
    # The work is many mid-sized ops: a second intra-op thread buys little, and when another
    # process holds a core it costs a lot (threads spin at every op's barrier). One thread here.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _compile(registry, tokenizer, max_string, utf8, dev)
    finally:
        torch.set_num_threads(threads)


def _compile(registry, tokenizer, max_string, utf8, dev) -> CompiledGrammar:
    t0 = time.perf_counter()
    paths = tool_paths(registry, max_string)
    dfa = build_byte_dfa(paths, utf8=utf8)
    token_bytes = list(tokenizer.token_bytes)
    eos_id = int(tokenizer.eos_id)
    V = len(token_bytes)
    if not 0 <= eos_id < V:
        raise ValueError(f"eos_id {eos_id} is outside the vocabulary (size {V})")
    token_bytes[eos_id] = b""          # EOS carries no text: it is handled as its own class
    vocab = FlatVocab(token_bytes, dev)
    delta = torch.as_tensor(byte_table(dfa, value_depth=max(vocab.max_len, 1)), device=dev)
    body = torch.as_tensor(U.body_table(utf8), device=dev)
    S_dfa, n_lit = dfa.num_states, dfa.num_lit

    # Literal states: sparse triples, then a dense [n_lit, V] only in compact form for the key.
    src, tok, nxt = _literal_columns(dfa, delta, vocab)
    kind, run, eff, after = _value_signature(dfa, delta, vocab, body)

    # Literal part of the key: tokens live in some literal state get an id per distinct column.
    lit_id = torch.zeros(V, dtype=torch.int64, device=dev)
    active = torch.unique(tok)
    if len(active):
        pos = torch.searchsorted(active, tok)
        cols = torch.full((len(active), n_lit), -1, dtype=torch.int64, device=dev)
        cols[pos, src] = nxt
        lit_id[active] = _classes_of(cols)[0] + 1
    special = torch.zeros(V, dtype=torch.int64, device=dev)
    special[eos_id] = 1
    keys = torch.cat([torch.stack([special, lit_id, kind, run], 1), eff.T, after.T], 1)   # [V, K]
    token_class, rep = _classes_of(keys)
    C = len(rep)

    # Rows of the table: literal states, value states, final, done. Value states far from both
    # ends of their value behave alike up to a shift, so only one row per sub-state is computed
    # for them (see _factor_rows); every other state gets its own.
    done = S_dfa
    rep_pos = torch.full((V,), -1, dtype=torch.int64, device=dev)
    rep_pos[rep] = torch.arange(C, device=dev)
    lit_rows = torch.full((n_lit, C), -1, dtype=torch.int64, device=dev)
    sel = rep_pos[tok] >= 0
    lit_rows[src[sel], rep_pos[tok[sel]]] = nxt[sel]
    eos_class = int(token_class[eos_id])
    end_rows = torch.full((2, C), -1, dtype=torch.int64, device=dev)
    end_rows[:, eos_class] = done               # a complete call allows EOS only; a finished row stays finished
    class_size = torch.bincount(token_class, minlength=C)
    sig = (kind[rep], run[rep], eff[:, rep], after[:, rep])
    far_depth = vocab.max_len + int(U.PENDING.max())
    value_ids, value_rows, within = _value_rows(dfa, *sig, dev, far_depth=far_depth)
    rows = torch.cat([lit_rows, value_rows, end_rows])                             # [n_rows, C] absolute
    row_state = torch.cat([torch.arange(n_lit, device=dev), value_ids,
                           torch.tensor([dfa.final, done], device=dev)])           # [n_rows]
    dead = ((rows >= 0) & (class_size > 0)[None, :]).sum(1) == 0
    if bool(dead.any()):
        # Some states have no way out (a vocabulary without single bytes): prune on the full table.
        value_ids, value_rows, within = _value_rows(dfa, *sig, dev, far_depth=None)
        full = torch.cat([lit_rows, value_rows, end_rows])
        full = _prune_dead_ends(full, class_size, final_states=(dfa.final, done))
        rows, row_state = full, torch.arange(S_dfa + 1, device=dev)
    relative = torch.zeros_like(rows, dtype=torch.bool)
    relative[n_lit:n_lit + len(value_ids)] = within
    relative &= rows >= 0                                   # pruning may have cut some
    state_row, row_next = _factor_rows(dfa, rows, row_state, relative, S_dfa + 1, far_depth)
    # Merge classes whose columns came out equal (signatures are sufficient, not necessary).
    merged, col_rep = _classes_of(row_next.T.contiguous())
    row_next = row_next[:, col_rep]
    token_class = merged[token_class]
    class_size = torch.bincount(token_class, minlength=row_next.shape[1])
    row_legal = ((row_next != -1).to(torch.int64) @ class_size).to(torch.int32)   # [R]

    lo, hi = int(row_next.min()), int(row_next.max())
    store = torch.int16 if -32768 <= lo and hi <= 32767 else torch.int32
    g = CompiledGrammar(
        token_class=token_class.to(torch.int32),
        state_row=state_row.to(torch.int32),
        row_next=row_next.to(store),
        legal_count=row_legal[state_row],
        final=torch.zeros(S_dfa + 1, dtype=torch.bool, device=dev).index_fill_(
            0, torch.tensor([dfa.final, done], device=dev), True),
        start=0, eos_id=eos_id, done_state=done,
        token_bytes=list(tokenizer.token_bytes),
        meta=_meta(registry, tokenizer, max_string, utf8),
        dfa=dfa,
    )
    g.compile_seconds = time.perf_counter() - t0
    return g


def _factor_rows(dfa: ByteDFA, rows, row_state, relative, S: int, far_depth):
    """Share rows between states: (state_row int64 [S], row_next int64 [R, C]).

    In a value state's row, a move that stays inside the value (`relative`) is stored relative
    to the state (code -2 - (target - state), always <= -3: a value only grows); every other
    move (closing the value, even into the next value or the end) stays absolute; -1 is illegal.
    Value states far from both ends of their block then have
    identical rows per sub-state, and equal rows anywhere are stored once: R stays in the
    hundreds whatever max_string is, and the table is a few hundred KB instead of S x C.
    """
    dev = rows.device
    codes = torch.where(relative, encode_relative(rows, row_state[:, None]), rows)           # [n_rows, C]
    row_of, uniq = _classes_of(codes)
    row_next = codes[uniq]
    state_row = torch.full((S,), -1, dtype=torch.int64, device=dev)
    state_row[row_state] = row_of
    if len(row_state) < S:
        # States not computed share their sub-state's representative (see _value_rows).
        for blk in dfa.blocks:
            ids = blk.base + torch.arange(len(blk.ns), device=dev)
            far = _far_mask(blk, far_depth, dev)
            us = torch.as_tensor(blk.us, device=dev)
            first_far = torch.full((dfa.num_substates,), -1, dtype=torch.int64, device=dev)
            first_far.scatter_reduce_(0, us[far], ids[far], reduce="amin", include_self=False)
            state_row[ids[far]] = state_row[first_far[us[far]]]
    assert int(state_row.min()) >= 0, "every state has a row"
    return state_row, row_next


def _far_mask(blk, far_depth, dev) -> torch.Tensor:
    """bool [Nb]: value states whose every move lands inside the block's full grid, away from the cap."""
    ns = torch.as_tensor(blk.ns, device=dev)
    if far_depth is None:
        return torch.zeros_like(ns, dtype=torch.bool)
    return (ns >= max(1, blk.min)) & (ns + far_depth <= blk.max)


def _prune_dead_ends(table: torch.Tensor, class_size: torch.Tensor, final_states) -> torch.Tensor:
    """Cut every transition into a state from which no token sequence reaches the end.

    With a vocabulary that has every single byte this changes nothing; with one that lacks
    some, it keeps a row from being steered into a state it can never leave (the DFA is
    acyclic apart from `done`, so repeating until nothing changes is exact).
    """
    keep = torch.zeros(table.shape[0], dtype=torch.bool, device=table.device)
    keep[list(final_states)] = True
    while True:
        live = (table >= 0) & (class_size > 0)[None, :]
        dead = ~live.any(1) & ~keep
        if not dead.any():
            return table
        into_dead = (table >= 0) & dead[table.clamp(min=0)]
        if not into_dead.any():
            return table
        table = torch.where(into_dead, torch.full_like(table, -1), table)
        keep = keep | dead          # already cut off: don't count them again


def _meta(registry, tokenizer, max_string, utf8) -> dict:
    vocab_hash = tokenizer.vocab_hash() if hasattr(tokenizer, "vocab_hash") else _hash_vocab(
        tokenizer.token_bytes, tokenizer.eos_id)
    return {"format": CACHE_FORMAT, "registry": registry.grammar_key(), "max_string": max_string,
            "utf8": bool(utf8), "vocab_hash": vocab_hash, "vocab_size": len(tokenizer.token_bytes)}


def _hash_vocab(token_bytes, eos_id) -> str:
    import hashlib
    lengths = np.fromiter((len(b) for b in token_bytes), dtype=np.int64, count=len(token_bytes))
    h = hashlib.sha256(lengths.tobytes())
    h.update(b"".join(token_bytes))
    h.update(int(eos_id).to_bytes(8, "little"))
    return h.hexdigest()


class CompiledGrammar:
    """The compiled tool-call grammar: a factored state x token table on one device.

        token_class  int32 [V]       the column each token uses
        state_row    int32 [S]       the row each state uses
        row_next     int16 [R, C]    next-state codes (see decode_next); int32 if they need it
        legal_count  int32 [S]       how many token ids are legal in each state
        final        bool  [S]       the call is complete (EOS, and only EOS, is legal)

    next_state(s, t) = decode_next(row_next[state_row[s], token_class[t]], s).
    `class_next` materialises the plain [S, C] table of next states (-1 illegal) on demand.
    """

    def __init__(self, token_class, state_row, row_next, legal_count, final, start, eos_id, done_state,
                 token_bytes, meta, dfa):
        self.token_class = token_class          # int32 [V]
        self.state_row = state_row              # int32 [S]
        self.row_next = row_next                # int16/int32 [R, C]
        self.legal_count = legal_count          # int32 [S]
        self.final = final                      # bool [S]
        self.start = int(start)
        self.eos_id = int(eos_id)
        self.done_state = int(done_state)
        self.token_bytes = token_bytes
        self.meta = meta
        self.dfa = dfa
        self.compile_seconds = 0.0
        self._class_next = None

    # --- shape ------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.row_next.device

    @property
    def num_states(self) -> int:
        return self.state_row.shape[0]

    @property
    def num_rows(self) -> int:
        return self.row_next.shape[0]

    @property
    def num_classes(self) -> int:
        return self.row_next.shape[1]

    @property
    def vocab_size(self) -> int:
        return self.token_class.shape[0]

    @property
    def nbytes(self) -> int:
        """Device memory held by the grammar's tables."""
        return sum(t.element_size() * t.numel()
                   for t in (self.token_class, self.state_row, self.row_next, self.legal_count, self.final))

    @property
    def class_next(self) -> torch.Tensor:
        """int32 [S, C]: the unfactored table of next states (-1 illegal), built on first use."""
        if self._class_next is None:
            S = self.num_states
            states = torch.arange(S, device=self.device)[:, None]
            self._class_next = decode_next(self.row_next[self.state_row.long()], states).to(torch.int32)
        return self._class_next

    def to(self, device) -> CompiledGrammar:
        g = CompiledGrammar(self.token_class.to(device), self.state_row.to(device), self.row_next.to(device),
                            self.legal_count.to(device), self.final.to(device), self.start, self.eos_id,
                            self.done_state, self.token_bytes, self.meta, self.dfa)
        g.compile_seconds = self.compile_seconds
        return g

    # --- queries (vectorised, on the grammar's device) ----------------------------------------
    def _states(self, states) -> torch.Tensor:
        s = torch.as_tensor(states, device=self.device).long()
        if s.numel() and (int(s.min()) < 0 or int(s.max()) >= self.num_states):
            raise IndexError(f"state out of range [0, {self.num_states})")
        return s

    def next_state(self, states, tokens) -> torch.Tensor:
        """LongTensor: the state after each token, -1 where the token is illegal."""
        s = self._states(states)
        t = torch.as_tensor(tokens, device=self.device).long()
        in_vocab = (t >= 0) & (t < self.vocab_size)
        cls = self.token_class[t.clamp(0, self.vocab_size - 1)].long()
        nxt = decode_next(self.row_next[self.state_row[s].long(), cls], s)
        return torch.where(in_vocab, nxt, torch.full_like(nxt, -1))

    def allowed(self, states) -> torch.Tensor:
        """BoolTensor [n, V]: which tokens are legal in each state."""
        s = self._states(states).reshape(-1)
        return self.row_next[self.state_row[s].long()][:, self.token_class.long()] != -1

    def is_final(self, states) -> torch.Tensor:
        return self.final[self._states(states)]

    def legal_counts(self, states) -> torch.Tensor:
        return self.legal_count[self._states(states)]

    # --- host-side helpers -------------------------------------------------------------------
    def finish_bytes(self, state: int) -> bytes:
        """Bytes still owed from `state` for the shortest complete call ('?' fill)."""
        state = int(state)
        if state == self.done_state or bool(self.final[state]):
            return b""
        return self.dfa.finish_bytes(state)

    def finish_text(self, state: int) -> str:
        return self.finish_bytes(state).decode("utf-8", errors="surrogateescape")

    def describe(self, state: int) -> list:
        state = int(state)
        if state == self.done_state:
            return ["done"]
        return self.dfa.describe(state)

    # --- cache -------------------------------------------------------------------------------
    _TABLES = ("token_class", "state_row", "row_next", "legal_count", "final")

    def save(self, path) -> None:
        meta = dict(self.meta, bytes_hash=_hash_vocab(self.token_bytes, self.eos_id))
        payload = {"meta": meta, "start": self.start, "eos_id": self.eos_id, "done_state": self.done_state}
        payload.update({k: getattr(self, k).cpu() for k in self._TABLES})
        # the vocabulary's bytes too (as tensors: the file loads with weights_only), so that a cache file
        # is usable on its own; with a tokenizer given, load checks it against the recorded hash instead
        lengths = np.fromiter((len(b) for b in self.token_bytes), dtype=np.int64, count=len(self.token_bytes))
        payload["token_lengths"] = torch.from_numpy(lengths)
        payload["token_data"] = torch.frombuffer(bytearray(b"".join(self.token_bytes) or b"\0"), dtype=torch.uint8)
        torch.save(payload, Path(path))

    @classmethod
    def load(cls, path, device="cpu", registry: ToolRegistry | None = None, tokenizer=None,
             max_string: int | None = None, utf8: bool | None = None) -> CompiledGrammar:
        """Load a cache file, refusing one built for another registry, vocabulary or options.

        With `tokenizer` (and `registry`, options) given, the file must have been built for them. Without,
        the registry and vocabulary recorded in the file are used (the vocabulary checked against its hash).
        """
        path = Path(path)
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise GrammarCacheError(f"{path}: grammar cache not found") from None
        except Exception as e:  # torch raises many kinds on a corrupt zip/pickle
            raise GrammarCacheError(f"{path}: not a readable grammar cache ({type(e).__name__}: {e})") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("meta"), dict) \
                or payload["meta"].get("format") != CACHE_FORMAT:
            raise GrammarCacheError(f"{path}: not a batchmask grammar cache (expected format {CACHE_FORMAT!r})")
        meta = payload["meta"]
        if tokenizer is None:
            tokenizer = _stored_vocab(payload, meta, path)
        reg = registry if registry is not None else _registry_from_key(meta["registry"])
        expect = _meta(reg, tokenizer, meta["max_string"] if max_string is None else max_string,
                       meta["utf8"] if utf8 is None else utf8)
        for field_ in ("registry", "max_string", "utf8", "vocab_hash", "vocab_size"):
            if meta.get(field_) != expect[field_]:
                got, want = meta.get(field_), expect[field_]
                if field_ == "vocab_hash":
                    got, want = str(got)[:12] + "...", str(want)[:12] + "..."
                raise GrammarCacheError(f"{path}: built for another {field_}: file has {got!r}, expected {want!r}")
        try:
            t = {k: payload[k] for k in cls._TABLES}
            S, (R, C) = t["state_row"].shape[0], t["row_next"].shape
            ok = (t["token_class"].shape == (meta["vocab_size"],) and t["legal_count"].shape == (S,)
                  and t["final"].shape == (S,) and 0 <= int(t["token_class"].min()) and int(t["token_class"].max()) < C
                  and 0 <= int(t["state_row"].min()) and int(t["state_row"].max()) < R
                  and int(t["row_next"].max()) < S)
        except (KeyError, AttributeError, ValueError, RuntimeError, TypeError):
            ok = False
        if not ok:
            raise GrammarCacheError(f"{path}: corrupt grammar cache (tables missing or of inconsistent shapes)")
        # The DFA description (for finish/describe) is cheap to rebuild from the registry.
        dfa = build_byte_dfa(tool_paths(reg, meta["max_string"]), utf8=meta["utf8"])
        if dfa.num_states + 1 != S:
            raise GrammarCacheError(f"{path}: corrupt grammar cache ({S} states, the registry gives "
                                    f"{dfa.num_states + 1})")
        return cls(*(t[k].to(device) for k in cls._TABLES), payload["start"], payload["eos_id"],
                   payload["done_state"], list(tokenizer.token_bytes), meta, dfa)

    def __repr__(self) -> str:
        return (f"CompiledGrammar(states={self.num_states}, rows={self.num_rows}, classes={self.num_classes}, "
                f"vocab={self.vocab_size}, bytes={self.nbytes}, device={self.device})")


def _stored_vocab(payload: dict, meta: dict, path):
    """The vocabulary saved in a cache file, checked against the hash recorded beside it."""
    try:
        lengths = payload["token_lengths"].numpy()
        data = payload["token_data"].numpy().tobytes()
        ends = np.cumsum(lengths)
        starts = ends - lengths
        token_bytes = [data[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
    except (KeyError, AttributeError, ValueError, TypeError):
        raise GrammarCacheError(f"{path}: corrupt grammar cache (no readable vocabulary)") from None
    vocab = SimpleNamespace(token_bytes=token_bytes, eos_id=payload.get("eos_id"))
    if _hash_vocab(token_bytes, vocab.eos_id) != meta.get("bytes_hash"):
        raise GrammarCacheError(f"{path}: corrupt grammar cache (its vocabulary does not match its hash)")
    vocab.vocab_hash = lambda: meta.get("vocab_hash")     # the tokenizer's own hash, recorded at compile time
    return vocab


def _registry_from_key(key) -> ToolRegistry:
    from .registry import Tool, ToolArg
    return ToolRegistry([Tool(name, "", tuple(ToolArg(a) for a in args)) for name, args in key])
