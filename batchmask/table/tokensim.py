"""Tokens run through the automaton: explicit states over the vocabulary trie, value bodies by signature.

What depends on the vocabulary alone is computed once per tokenizer and kept (`prepare_vocab`,
an in-memory cache keyed by the tokenizer's vocab_hash() and stop ids, a few entries):

  * FlatVocab: every token's bytes in one flat array, and (on first use) its trie (table/trie.py);
  * per value type (grammar/values.py), each token's *signature* from every sub-state q (table/signature.py):
    whether its bytes stay inside the value, stop at a byte the value cannot take where it may end, or die.
    From a cell (n, q) of any value of that type the token's effect is then this signature plus the bounds
    checks of grammar/values.py, so it is computed once, not per cell, per value or per grammar.

What depends on the grammar (the explicit states' columns, the rest of a token after a value
ends) is simulated per compile, on the live (state, token) pairs only.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from ..grammar.values import ValueType
from .classes import classes_of, distinct
from .signature import DIES, STAYS, STOPS, Signature, compute_signature
from .trie import VocabTrie, Walked, spread, unbudgeted, walk_pairs

__all__ = ["DIES", "STAYS", "STOPS", "Signature", "FlatVocab", "VocabPrep", "prepare_vocab", "explicit_columns",
           "explicit_pairs", "after_stops", "run_tokens"]


class FlatVocab:
    """The vocabulary as one byte string: token t is flat[offset[t] : offset[t] + length[t]].

    Work is then proportional to the total bytes of the vocabulary, not V x (longest token).
    """

    def __init__(self, token_bytes: list[bytes], device):
        lengths = np.fromiter(map(len, token_bytes), dtype=np.int64, count=len(token_bytes))
        joined = b"".join(token_bytes) + b"\0"                    # one pad byte: reads past a token stay in range
        self.flat_np = np.frombuffer(joined, dtype=np.uint8).astype(np.int64)                             # [N+1]
        self.flat_u8 = np.frombuffer(joined, dtype=np.uint8)                                             # [N+1]
        self.flat = torch.from_numpy(self.flat_np).to(device)                                            # [N+1]
        self.lengths = torch.from_numpy(lengths).to(device)                                              # [V]
        self.offset = torch.cumsum(self.lengths, 0) - self.lengths                                       # [V]
        self.max_len = int(lengths.max(initial=0))
        self._token_bytes = token_bytes                            # kept for the trie (built on first use)
        self._rests: dict = {}                                     # rests_trie's, by the rests they hold
        # host copies for the per-compile simulation (many small ops: numpy's per-op cost is a fraction of torch's)
        self.offset_np, self.lengths_np = self.offset.cpu().numpy(), lengths

    def __len__(self) -> int:
        return self.lengths.shape[0]

    @cached_property
    def trie(self) -> VocabTrie:
        """The vocabulary's trie (table/trie.py), for the explicit states' columns; built on first use."""
        return VocabTrie.of(self._token_bytes, self.flat_u8, self.offset_np, self.lengths_np)

    def rests_trie(self, at: np.ndarray, n: np.ndarray) -> VocabTrie:
        """The trie of the token rests flat[at[r] : at[r] + n[r]] (after_stops: what tokens hold after a value's
        ending byte), kept per set of rests: the same ending bytes give the same rests at every compile."""
        key = (at.tobytes(), n.tobytes())
        trie = self._rests.get(key)
        if trie is None:
            flat = np.append(self.flat_u8[spread(at, n)], np.uint8(0))              # the rests laid end to end
            trie = self._rests[key] = VocabTrie.of(None, flat, np.cumsum(n) - n, n)
            while len(self._rests) > RESTS_KEPT:
                self._rests.pop(next(iter(self._rests)))
        return trie

    @cached_property
    def max_tail(self) -> np.ndarray:
        """int64 [256]: the most bytes any token has after an occurrence of each byte value (0 if none).

        A token that enters a value by byte b adds at most max_tail[b] units to it (automaton.byte_table)."""
        flat = self.flat_np[:-1]
        tail = np.repeat(self.offset_np + self.lengths_np, self.lengths_np) - np.arange(len(flat)) - 1    # [N]
        out = np.zeros(256, dtype=np.int64)
        np.maximum.at(out, flat, tail)
        return out

    def byte_at(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.flat[self.offset[tok] + pos]


@dataclass
class VocabPrep:
    """The vocabulary-only work for one tokenizer (stop ids' bytes blanked: they are never text)."""
    token_bytes: list
    eos_id: int
    stop_ids: tuple
    vocab: FlatVocab
    signatures: dict = field(default_factory=dict)
    vocab_hash: str = ""       # vocab_hash_of(tokenizer): hashed once per compile, not again for the cache meta
    text: list = None          # the tokenizer's token_bytes as they were (stops not blanked), copied once: what
                               # each CompiledGrammar keeps (one list shared, not a 128K-entry copy per compile)

    def signature(self, vt: ValueType) -> Signature:
        if vt.name not in self.signatures:
            self.signatures[vt.name] = compute_signature(vt, self.vocab)
        return self.signatures[vt.name]

    def value_classes(self, vts: list) -> torch.Tensor:
        """int64 [V]: tokens alike in every value type of `vts` and in their role (eos, other stop, text)."""
        key = tuple(sorted(vt.name for vt in vts))
        if key not in self.signatures:
            V = len(self.vocab)
            dev = self.vocab.flat.device
            role = torch.zeros(V, dtype=torch.int64, device=dev)
            role[list(self.stop_ids)] = 2
            role[self.eos_id] = 1
            parts = [role] + [self.signature(vt).sig_id for vt in sorted(vts, key=lambda v: v.name)]
            self.signatures[key] = classes_of(torch.stack(parts, 1))[0]
        return self.signatures[key]


_CACHE: OrderedDict = OrderedDict()
CACHE_SIZE = 4
RESTS_KEPT = 16            # tries of token rests kept per vocabulary (FlatVocab.rests_trie)


def stop_ids_of(tokenizer) -> tuple:
    eos = int(tokenizer.eos_id)
    stops = tuple(int(s) for s in getattr(tokenizer, "stop_ids", None) or (eos,))
    return stops if eos in stops else (eos,) + stops


def vocab_hash_of(tokenizer) -> str:
    if hasattr(tokenizer, "vocab_hash"):
        return str(tokenizer.vocab_hash())
    return hash_vocab(tokenizer.token_bytes, tokenizer.eos_id, stop_ids_of(tokenizer))


def hash_vocab(token_bytes, eos_id, stop_ids=None) -> str:
    """sha256 of the token bytes, the eos id and (when not just eos) the stop ids."""
    lengths = np.fromiter(map(len, token_bytes), dtype=np.int64, count=len(token_bytes))
    h = hashlib.sha256(lengths.tobytes())
    h.update(b"".join(token_bytes))
    h.update(int(eos_id).to_bytes(8, "little"))
    if stop_ids is not None and tuple(stop_ids) != (int(eos_id),):
        h.update(np.asarray(stop_ids, dtype=np.int64).tobytes())
    return h.hexdigest()


def prepare_vocab(tokenizer, device) -> VocabPrep:
    """The cached vocabulary work for `tokenizer` on `device` (built on first use)."""
    token_bytes = tokenizer.token_bytes
    V = len(token_bytes)
    eos_id = int(tokenizer.eos_id)
    stops = stop_ids_of(tokenizer)
    for s in stops:
        if not 0 <= s < V:
            raise ValueError(f"stop id {s} is outside the vocabulary (size {V})")
    vhash = vocab_hash_of(tokenizer)
    key = (vhash, stops, eos_id, V, str(torch.device(device)))
    prep = _CACHE.get(key)
    if prep is None:
        blanked = list(token_bytes)
        for s in stops:
            blanked[s] = b""          # a stop token carries no text: it is handled as its own class
        prep = VocabPrep(blanked, eos_id, stops, FlatVocab(blanked, device), vocab_hash=vhash,
                         text=list(token_bytes))
        _CACHE[key] = prep
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    return prep


# --- byte-by-byte simulation -----------------------------------------------------------------------
@dataclass
class ByteSteps:
    """The automaton's byte table (automaton.byte_table) by byte class, on the host (where it is simulated)."""
    delta: np.ndarray          # int32 [Sc, K]: next state per byte class, -1 illegal
    byte_class: np.ndarray     # int64 [256]

    @classmethod
    def of(cls, delta, byte_class, vocab: FlatVocab, dev) -> ByteSteps:
        # the class of a vocabulary byte is looked up where a live pair reads it (_run), not for all
        # N bytes of the vocabulary at every compile; `dev` is where the results go
        return cls(np.ascontiguousarray(delta, dtype=np.int32), np.asarray(byte_class, dtype=np.int64))


def _run(steps: ByteSteps, vocab: FlatVocab, start: np.ndarray, tok: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """run_tokens on host arrays: int64 [P] in, int64 [P] out."""
    K = steps.delta.shape[1]
    flat_delta = steps.delta.reshape(-1)
    out = np.full(len(start), -1, dtype=np.int64)
    begin, end = vocab.offset_np[tok], vocab.offset_np[tok] + vocab.lengths_np[tok]
    ended = begin + pos >= end                       # nothing left to feed: stays where it is
    out[ended] = start[ended]
    live = np.flatnonzero(~ended & (start >= 0))
    # live pairs: pair index, state, read pointer, bytes left (int32: the loop is memory-bound); the class of
    # each vocabulary byte read through a 256-entry table
    idx, cur = live.astype(np.int32), start[live].astype(np.int32)
    ptr, left = (begin + pos)[live].astype(np.int64), (end - begin - pos)[live].astype(np.int32)
    cls = steps.byte_class.astype(np.int32)
    flat = vocab.flat_u8
    while len(idx):
        cur = flat_delta[cur * K + cls[flat[ptr]]]
        ptr += 1
        left -= 1
        fin = left == 0
        out[idx[fin]] = cur[fin]
        go = ~fin & (cur >= 0)
        if not go.all():
            idx, cur, ptr, left = idx[go], cur[go], ptr[go], left[go]
    return out


def run_tokens(steps: ByteSteps, vocab: FlatVocab, start: torch.Tensor, tok: torch.Tensor,
               offset: torch.Tensor) -> torch.Tensor:
    """Feed token `tok[p]` from byte `offset[p]` on, starting in state `start[p]`.

    start/tok/offset int64 [P]. Returns int64 [P] (on start's device): the state after the token's
    last byte, or -1. Simulated on the host; only live pairs are carried from one byte to the next.
    """
    host = [x.cpu().numpy().astype(np.int64, copy=False) for x in (start, tok, offset)]
    return torch.from_numpy(_run(steps, vocab, *host)).to(start.device)


def explicit_columns(edges: torch.Tensor, steps: ByteSteps, vocab: FlatVocab):
    """Where each token leads from each explicit state, as sparse (state, token, next) triples.

    edges int64 [E, 3] (src, byte, first state after the byte, in delta's ids). The tokens starting with
    each edge's byte are walked over the vocabulary's trie (table/trie.py): the work is the number of live
    (edge, prefix) pairs, and a pair dies with its prefix. Each (state, token) pair at most once, in no
    promised order.
    """
    dev = vocab.flat.device
    return tuple(torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)).to(dev)
                 for x in explicit_pairs(edges, steps, vocab).moves())


def explicit_pairs(edges: torch.Tensor, steps: ByteSteps, vocab: FlatVocab) -> Walked:
    """explicit_columns' finds before they are handed to the edges: per distinct (byte, state after it) of the edges,
    on the host (table/trie.py Walked; its moves() are explicit_columns' triples)."""
    e = edges.cpu().numpy().astype(np.int64, copy=False).reshape(-1, 3)
    return walk_pairs(vocab.trie, steps.delta, steps.byte_class, e[:, 0], e[:, 1], e[:, 2])


def after_stops(sig: Signature, blocks: list, steps: ByteSteps, to_compact: torch.Tensor,
                from_compact: torch.Tensor, vocab: FlatVocab):
    """(events int64 [E'], after int64 [len(blocks), E']): the stop events whose ending byte ends some block
    (every other event is illegal in every block), and the state after each one's remaining bytes, per block,
    -1 if illegal.

    The byte that ends the value must be one of the block's ending bytes; the rest of the token
    then runs from the state that byte leads to. Events are kept sparse so: a type's events are every
    token with a byte the value cannot hold (most of a vocabulary), its blocks' ending bytes a few. Per ending byte,
    a few blocks run each (block, event) on its own; thousands (a value written out at every use) walk the events'
    rests over their trie from the blocks' distinct starts (`_rests_from`): a rest dies at its first byte from most.
    """
    dev = vocab.flat.device
    E = len(sig.ev_tok)
    if not E or not blocks:
        return (torch.zeros(0, dtype=torch.int64, device=dev),
                torch.full((len(blocks), 0), -1, dtype=torch.int64, device=dev))
    ev_tok, ev_pos, ev_byte, to_c, from_c = (x.cpu().numpy() for x in (sig.ev_tok, sig.ev_pos, sig.ev_byte,
                                                                      to_compact, from_compact))
    exits = np.stack([b.exits for b in blocks])                                   # [B, 256] global ids
    events = np.flatnonzero((exits >= 0).any(0)[ev_byte])                         # [E']
    out = np.full((len(blocks), len(events)), -1, dtype=np.int64)                 # [B, E']
    rest_at, rest_n = vocab.offset_np[ev_tok] + ev_pos + 1, vocab.lengths_np[ev_tok] - ev_pos - 1     # [E]
    for beta in distinct(ev_byte[events]).tolist():          # per ending byte: the blocks it ends, its events
        cols = np.flatnonzero(ev_byte[events] == beta)                            # [E_b] columns of its events
        rows = np.flatnonzero(exits[:, beta] >= 0)                                # [B_b] blocks it ends
        start = to_c[exits[rows, beta]].astype(np.int64)                          # [B_b] compact: rest starts here
        evs = events[cols]
        if len(rows) <= _WALK_FROM:              # few copies: each (block, event) run on its own
            bi = np.repeat(np.arange(len(rows)), len(cols))
            ei = np.tile(np.arange(len(cols)), len(rows))
            res = _run(steps, vocab, start[bi], ev_tok[evs[ei]], ev_pos[evs[ei]] + 1).reshape(len(rows), len(cols))
            out[np.ix_(rows, cols)] = np.where(res >= 0, from_c[np.maximum(res, 0)], -1)
        else:                                     # many: the rests walked over their trie from each distinct start
            starts, u = np.unique(start, return_inverse=True)                     # (-1, outside the table: dies)
            res = _rests_from(np.maximum(starts, 0), rest_at[evs], rest_n[evs], steps, vocab, from_c)  # [U, E_b]
            res[starts < 0] = -1
            out[np.ix_(rows, cols)] = res[u.reshape(-1)]                          # [B_b, E_b]
    return torch.from_numpy(events).to(dev), torch.from_numpy(out).to(dev)


# an ending byte that ends more blocks than this has its events' rests walked over a trie from the blocks' distinct
# starts (tokens share rests, and a rest dies at its first byte from most starts) instead of run block by block
_WALK_FROM = 8


def _rests_from(starts: np.ndarray, at: np.ndarray, n: np.ndarray, steps: ByteSteps, vocab: FlatVocab,
                ids: np.ndarray) -> np.ndarray:
    """int64 [U, R]: ids[the compact state after the bytes flat[at[r] : at[r] + n[r]]] (rest r of a token) from
    compact state starts[u] (-1 where it dies; the start itself for a rest of no bytes); `ids` (compact -> global) is
    applied to the live entries only: most die. The rests, laid end to end, make a trie (table/trie.py), walked
    from every start at once: the work is the live (start, rest prefix) pairs."""
    out = np.full((len(starts), len(at)), -1, dtype=np.int64)
    if not len(starts):
        return out
    out[:, n == 0] = ids[starts][:, None]
    trie = vocab.rests_trie(at, n)
    first = np.flatnonzero(trie.first >= 0)                                       # [nb] bytes a rest starts with
    nxt = steps.delta[starts][:, steps.byte_class[first]]                         # [U, nb]
    u, b = np.nonzero(nxt >= 0)
    with unbudgeted():
        src, rest, end = walk_pairs(trie, steps.delta, steps.byte_class, u, first[b], nxt[u, b]).moves()
    out[src, rest] = ids[end]
    return out
