"""Each token's effect on a value body from each sub-state: its *signature* (once per tokenizer and value type).

From a cell (n, q) of any value of a type (grammar/values.py), a token's bytes either stay inside the value
(the units they add, the sub-state they end in), stop at a byte the value cannot take where it may end (the
position of that byte: the value ends there and the rest of the token runs from what follows), or die. With
the bounds checks of grammar/values.py that is all a cell needs, so it is computed once per vocabulary, not
per cell, per value or per grammar (table/tokensim.py caches it per tokenizer).

The outcomes are kept as one packed int64 per (token, sub-state), [V, Q]: the signature id groups its
rows, and a compile reads only its class representatives' columns (`Signature.columns`), so the dense
[Q, V] fields are not written out per tokenizer unless asked for (`out`, `units`, `q_end`, `ev_of`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch

from .classes import classes_of
from .native import helpers

if TYPE_CHECKING:
    from ..grammar.values import ValueType
    from .tokensim import FlatVocab

# Signature outcomes of a token from a value sub-state.
DIES, STAYS, STOPS = 0, 1, 2


@dataclass
class Signature:
    """A value type's effect of every token from every sub-state (see the module docstring)."""
    packed: torch.Tensor       # int64 [V, Q]: ((out * L + units) * (Q + 1) + q_end + 1) * L + pos + 1 (0: dies)
    L: int                     # the packing base: max_len + 2 (units and stop positions are below it)
    ev_tok: torch.Tensor       # int64 [E]
    ev_pos: torch.Tensor       # int64 [E]: position of the byte that ends the value
    ev_byte: torch.Tensor      # int64 [E]: that byte
    ev_key: torch.Tensor       # int64 [E] ascending: ev_tok * (max_len + 1) + ev_pos (an event's index by search)
    sig_id: torch.Tensor       # int64 [V]: tokens with equal signatures from every sub-state share an id
    reach: torch.Tensor        # int64 [Q]: the most units any token adds from each sub-state
    # the cells where ev_of >= 0, in row-major (q, token) order, as torch.nonzero would give them: vocabulary-only,
    # so a compile need not search the [Q, V] field for them
    stop_q: torch.Tensor       # int64 [P]
    stop_t: torch.Tensor       # int64 [P]
    stop_ev: torch.Tensor      # int64 [P]: ev_of[stop_q, stop_t]

    def columns(self, tokens: torch.Tensor):
        """(out, units, q_end, ev_of), each int64 [Q, len(tokens)]: the signature of `tokens` (DIES / STAYS / STOPS;
        units added before the end or the stop; sub-state at the end or the stop, -1 if it dies; index of the
        (token, stop position) event, -1 if none)."""
        L, Q = self.L, self.packed.shape[1]
        p = self.packed.index_select(0, tokens).T                              # [Q, n]
        pos = p % L - 1
        rest = p // L
        q_end = rest % (Q + 1) - 1
        rest = rest // (Q + 1)
        units, out = rest % L, rest // L
        stops = out == STOPS
        key = tokens[None, :] * (L - 1) + pos                                  # only read where it stops
        ev = torch.searchsorted(self.ev_key, key.masked_fill(~stops, 0).contiguous()) if len(self.ev_key) else key
        return out, units, q_end, torch.where(stops, ev, -1)

    @cached_property
    def _dense(self):
        return self.columns(torch.arange(self.packed.shape[0], device=self.packed.device))

    # the dense [Q, V] fields, written out on first use (tests, tools); a compile reads `columns`
    out = property(lambda self: self._dense[0])
    units = property(lambda self: self._dense[1])
    q_end = property(lambda self: self._dense[2])
    ev_of = property(lambda self: self._dense[3])


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


def compute_signature(vt: ValueType, vocab: FlatVocab) -> Signature:
    """Simulated on the host, once per tokenizer and value type: in C where the compiled helpers are built (a byte
    at a time), else in numpy (small ops on shrinking arrays: numpy's per-op cost is a fraction of torch's)."""
    V, Q = len(vocab), vt.num_substates
    if helpers is not None:                  # the same records, a byte at a time in C (native_c/signature.c)
        got = helpers.simulate(np.ascontiguousarray(vt.table, dtype=np.int64).reshape(-1),
                               np.ascontiguousarray(vt.inc, dtype=np.int64).reshape(-1),
                               np.ascontiguousarray(vt.accept, dtype=bool), vocab.flat_u8,
                               np.ascontiguousarray(vocab.offset_np, dtype=np.int64),
                               np.ascontiguousarray(vocab.lengths_np, dtype=np.int64))
        return _signature(vocab, V, Q, *(np.frombuffer(x, dtype=np.int64) for x in got))
    return _signature(vocab, V, Q, *_simulate(vt, vocab))


def _simulate(vt: ValueType, vocab: FlatVocab):
    """(pid, code, units, q_end, pos) int64 [n] each: the pairs (sub-state q, token t), pid q * V + t, that stay
    inside the value (STAYS, pos -1) or stop at a byte where it may end (STOPS, that byte's position in the token);
    pairs that die are not listed. All pairs at once, a byte (or a run of loop bytes) a step."""
    V = len(vocab)
    flat = vocab.flat_np
    offset, lengths = vocab.offset_np, vocab.lengths_np
    table, inc, accept = vt.table.reshape(-1), vt.inc.reshape(-1), vt.accept
    # live (start sub-state, token) pairs, one column each: rows pid (q * V + t), sub-state, units,
    # read pointer, bytes left, token start (one array, so that dropping pairs is one op); a pair
    # can only live past its first byte if the sub-state takes that byte or may end there
    first = flat[offset]
    alive = ((vt.table >= 0)[:, first] | accept[:, None]) & (lengths > 0)[None, :]     # [Q, V] (a bool gather)
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
    return np.concatenate(done, 1) if done else np.zeros((5, 0), dtype=np.int64)


def _signature(vocab: FlatVocab, V: int, Q: int, pid, code, units_f, q_f, pos_f) -> Signature:
    """The Signature of the simulated pairs (_simulate); a cell no pair reached died."""
    dev = vocab.flat.device
    # the distinct (token, stop position) events
    stop = code == STOPS
    uniq, ev_index = np.unique(pid[stop] % V * (vocab.max_len + 1) + pos_f[stop], return_inverse=True)
    order = np.argsort(pid[stop])                                # pids are distinct: the cells in (q, t) order
    stop_cells = pid[stop][order]
    stop_q, stop_t = (torch.from_numpy(x).to(dev) for x in np.divmod(stop_cells, V))
    stop_ev = torch.from_numpy(ev_index[order].astype(np.int64, copy=False)).to(dev)
    ev_tok, ev_pos = (torch.from_numpy(x).to(dev) for x in np.divmod(uniq, vocab.max_len + 1))
    ev_byte = vocab.flat[vocab.offset[ev_tok] + ev_pos]
    # one number per (token, sub-state): outcome, units, end sub-state, stop position; 0 for a
    # cell that dies, so only the reached cells are written, straight into [V, Q] order
    L = vocab.max_len + 2
    packed = np.zeros(V * Q, dtype=np.int64)
    packed[(pid % V) * Q + pid // V] = ((code * L + units_f) * (Q + 1) + q_f + 1) * L + pos_f + 1
    packed_t = torch.from_numpy(packed.reshape(V, Q)).to(dev)
    sig_id = classes_of(packed_t)[0]
    reach = np.zeros(Q, dtype=np.int64)                          # units are 0 where a token dies
    np.maximum.at(reach, pid // V, units_f)
    return Signature(packed_t, L, ev_tok, ev_pos, ev_byte, torch.from_numpy(uniq).to(dev), sig_id,
                     torch.from_numpy(reach).to(dev), stop_q, stop_t, stop_ev)
