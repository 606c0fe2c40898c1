"""Tokens run through the automaton: explicit states over the vocabulary trie, value bodies by signature.

What depends on the vocabulary alone is computed once per tokenizer and kept (`prepare_vocab`,
an in-memory cache keyed by the tokenizer's vocab_hash() and stop ids, a few entries):

  * FlatVocab: every token's bytes in one flat array, and (on first use) its trie (table/trie.py);
  * per value type (grammar/values.py), each token's *signature* from every sub-state q: whether its
    bytes stay inside the value (the units they add, the sub-state they end in), stop at a byte
    the value cannot take where it may end (the position of that byte: the value ends there and
    the rest of the token runs from what follows), or die. From a cell (n, q) of any value of
    that type the token's effect is then this signature plus the bounds checks of grammar/values.py, so
    it is computed once, not per cell, per value or per grammar.

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
from .classes import classes_of
from .trie import VocabTrie
from .trie import walk as trie_walk

# Signature outcomes of a token from a value sub-state.
DIES, STAYS, STOPS = 0, 1, 2


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
        # host copies for the per-compile simulation (many small ops: numpy's per-op cost is a fraction of torch's)
        self.offset_np, self.lengths_np = self.offset.cpu().numpy(), lengths

    def __len__(self) -> int:
        return self.lengths.shape[0]

    @cached_property
    def trie(self) -> VocabTrie:
        """The vocabulary's trie (table/trie.py), for the explicit states' columns; built on first use."""
        return VocabTrie.of(self._token_bytes, self.flat_u8, self.offset_np, self.lengths_np)

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
class Signature:
    """A value type's effect of every token from every sub-state (see the module docstring)."""
    out: torch.Tensor          # int64 [Q, V]: DIES / STAYS / STOPS
    units: torch.Tensor        # int64 [Q, V]: units added before the end or the stop
    q_end: torch.Tensor        # int64 [Q, V]: sub-state at the end or the stop, -1 if it dies
    ev_of: torch.Tensor        # int64 [Q, V]: index of the (token, stop position) event, -1 if none
    ev_tok: torch.Tensor       # int64 [E]
    ev_pos: torch.Tensor       # int64 [E]: position of the byte that ends the value
    ev_byte: torch.Tensor      # int64 [E]: that byte
    sig_id: torch.Tensor       # int64 [V]: tokens with equal signatures from every sub-state share an id
    reach: torch.Tensor        # int64 [Q]: the most units any token adds from each sub-state
    # the cells where ev_of >= 0, in row-major (q, token) order, as torch.nonzero would give them: vocabulary-only,
    # so a compile need not search the [Q, V] field for them
    stop_q: torch.Tensor = None    # int64 [P]
    stop_t: torch.Tensor = None    # int64 [P]
    stop_ev: torch.Tensor = None   # int64 [P]: ev_of[stop_q, stop_t]


@dataclass
class VocabPrep:
    """The vocabulary-only work for one tokenizer (stop ids' bytes blanked: they are never text)."""
    token_bytes: list
    eos_id: int
    stop_ids: tuple
    vocab: FlatVocab
    signatures: dict = field(default_factory=dict)
    vocab_hash: str = ""       # vocab_hash_of(tokenizer): hashed once per compile, not again for the cache meta

    def signature(self, vt: ValueType) -> Signature:
        if vt.name not in self.signatures:
            self.signatures[vt.name] = _signature(vt, self.vocab)
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
        prep = VocabPrep(blanked, eos_id, stops, FlatVocab(blanked, device), vocab_hash=vhash)
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
    e = edges.cpu().numpy().astype(np.int64, copy=False).reshape(-1, 3)
    out = trie_walk(vocab.trie, steps.delta, steps.byte_class, e[:, 0], e[:, 1], e[:, 2])
    return tuple(torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)).to(dev) for x in out)


def _skips(vt: ValueType, flat: np.ndarray):
    """Run skipping: (row per sub-state [Q], skip_to [R, N+1], units per skipped byte [R]).

    Row 0 skips nothing; a sub-state whose loop bytes (bytes that lead back to it, all adding the
    same units: a value's ordinary characters) are many gets a row where skip_to[row, p] is the
    first position >= p whose byte is not one of them.
    """
    N1 = len(flat)
    row_of = np.zeros(vt.num_substates, dtype=np.int64)
    incs = [0]
    for q in range(vt.num_substates):
        loop = vt.table[q] == q
        if loop.sum() >= 8 and len(set(vt.inc[q][loop].tolist())) == 1:
            row_of[q] = len(incs)
            incs.append(int(vt.inc[q][loop][0]))
    # int32 positions, each row written in place: no [R, N+1] int64 stack to copy
    skip_to = np.empty((len(incs), N1), dtype=np.int32)
    pos = np.arange(N1, dtype=np.int32)
    skip_to[0] = pos
    for q in np.flatnonzero(row_of):
        breaks = ~(vt.table[q] == q)[flat]
        breaks[-1] = True                                            # the pad byte
        np.minimum.accumulate(np.where(breaks, pos, np.int32(N1))[::-1], out=skip_to[row_of[q]][::-1])
    return row_of, skip_to, np.array(incs, dtype=np.int64)


def _signature(vt: ValueType, vocab: FlatVocab) -> Signature:
    """Simulated on the host in numpy (small ops on shrinking arrays: numpy's per-op cost is a
    fraction of torch's), once per tokenizer and value type."""
    dev = vocab.flat.device
    V, Q = len(vocab), vt.num_substates
    flat = vocab.flat_np
    offset, lengths = (x.cpu().numpy() for x in (vocab.offset, vocab.lengths))
    table, inc, accept = vt.table.reshape(-1), vt.inc.reshape(-1), vt.accept
    # live (start sub-state, token) pairs, one column each: rows pid (q * V + t), sub-state, units,
    # read pointer, bytes left, token start (one array, so that dropping pairs is one op); a pair
    # can only live past its first byte if the sub-state takes that byte or may end there
    first = flat[offset]
    alive = ((vt.table[:, first] >= 0) | accept[:, None]) & (lengths > 0)[None, :]     # [Q, V]
    q_all, t_all = np.nonzero(alive)
    off = offset[t_all]
    st = np.stack([q_all * V + t_all, q_all, np.zeros_like(q_all), off, lengths[t_all], off])
    PID, CUR, K, PTR, LEFT, START = range(6)
    done = []                                                    # [5, n] blocks: pid, code, units, q, pos
    skip_row, skip_to, skip_inc = _skips(vt, flat)

    def finish(sel, code, pos):
        done.append(np.stack([st[PID, sel], np.full(int(sel.sum()), code), st[K, sel], st[CUR, sel], pos]))
    while st.shape[1]:
        # a run of bytes that loop on the sub-state (a value's ordinary characters) in one step
        row = skip_row[st[CUR]]
        j = np.minimum(skip_to[row, st[PTR]], st[PTR] + st[LEFT])
        d = j - st[PTR]
        st[K] += d * skip_inc[row]
        st[PTR] = j
        st[LEFT] -= d
        ended = st[LEFT] == 0
        if ended.any():
            finish(ended, STAYS, np.full(int(ended.sum()), -1))
            st = st[:, ~ended]
            if not st.shape[1]:
                break
        cell = st[CUR] * 256 + flat[st[PTR]]
        nq = table[cell]
        stops = accept[st[CUR]] & (nq < 0)                      # ends the value here (if what follows takes b)
        if stops.any():
            finish(stops, STOPS, st[PTR, stops] - st[START, stops])
        go = nq >= 0
        st[CUR] = nq
        st[K] += inc[cell]
        st[PTR] += 1
        st[LEFT] -= 1
        st = st[:, go]
        ended = st[LEFT] == 0
        if ended.any():
            finish(ended, STAYS, np.full(int(ended.sum()), -1))
            st = st[:, ~ended]
    # Dense [Q, V] fields from the sparse outcomes, on the host: a cell no pair reached died.
    pid, code, units_f, q_f, pos_f = np.concatenate(done, 1) if done else np.zeros((5, 0), dtype=np.int64)

    def spread(values: np.ndarray, fill: int) -> np.ndarray:
        a = np.full(Q * V, fill, dtype=np.int64)
        a[pid] = values
        return a.reshape(Q, V)
    out, units, q_end = spread(code, DIES), spread(units_f, 0), spread(q_f, -1)
    # the distinct (token, stop position) events
    stop = code == STOPS
    qi, ti = np.divmod(pid[stop], V)
    uniq, ev_index = np.unique(ti * (vocab.max_len + 1) + pos_f[stop], return_inverse=True)
    ev_of = np.full(Q * V, -1, dtype=np.int64)
    ev_of[pid[stop]] = ev_index
    stop_cells = np.sort(pid[stop])
    stop_q, stop_t = (torch.from_numpy(x).to(dev) for x in np.divmod(stop_cells, V))
    stop_ev = torch.from_numpy(ev_of[stop_cells]).to(dev)
    ev_tok, ev_pos = (torch.from_numpy(x).to(dev) for x in np.divmod(uniq, vocab.max_len + 1))
    ev_byte = vocab.flat[vocab.offset[ev_tok] + ev_pos]
    # one number per (token, sub-state): outcome, units, end sub-state, stop position; 0 for a
    # cell that dies, so only the reached cells are written, straight into [V, Q] order
    L = vocab.max_len + 2
    packed = np.zeros(V * Q, dtype=np.int64)
    packed[(pid % V) * Q + pid // V] = ((code * L + units_f) * (Q + 1) + q_f + 1) * L + pos_f + 1
    sig_id = classes_of(torch.from_numpy(packed.reshape(V, Q)).to(dev))[0]
    reach = units.max(1, initial=0)                  # units are 0 where a token dies
    out, units, q_end, ev_of, reach = (torch.from_numpy(x).to(dev) for x in (out, units, q_end, ev_of.reshape(Q, V),
                                                                             reach))
    return Signature(out, units, q_end, ev_of, ev_tok, ev_pos, ev_byte, sig_id, reach, stop_q, stop_t, stop_ev)


def after_stops(sig: Signature, blocks: list, steps: ByteSteps, to_compact: torch.Tensor,
                from_compact: torch.Tensor, vocab: FlatVocab):
    """(events int64 [E'], after int64 [len(blocks), E']): the stop events whose ending byte ends some block
    (every other event is illegal in every block), and the state after each one's remaining bytes, per block,
    -1 if illegal.

    The byte that ends the value must be one of the block's ending bytes; the rest of the token
    then runs from the state that byte leads to. Events are kept sparse so: a type's events are every
    token with a byte the value cannot hold (most of a vocabulary), its blocks' ending bytes a few.
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
    start = exits[:, ev_byte[events]]                                             # [B, E']
    bi, ei = np.nonzero(start >= 0)
    res = _run(steps, vocab, to_c[start[bi, ei]].astype(np.int64), ev_tok[events[ei]], ev_pos[events[ei]] + 1)
    out = np.full(start.shape, -1, dtype=np.int64)
    out[bi, ei] = np.where(res >= 0, from_c[np.maximum(res, 0)], -1)
    return torch.from_numpy(events).to(dev), torch.from_numpy(out).to(dev)
