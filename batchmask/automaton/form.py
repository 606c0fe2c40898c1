"""The automaton form the table builder consumes, and its byte transition table.

Two producers build it: automaton/dfa.py (the seed's linear literal/value paths) and automaton/tree.py
(any tree of grammar/nodes.py's nodes). Either way a grammar is

    explicit states   ordinary DFA states with byte transitions, listed as `edges` (src, byte, dst);
                      `accepting` ones are where the value is complete (the stop tokens are legal)
    blocks            one per value body (a seed `Str` or a `JsonStr` with its continuation): the
                      cells (n, q) of values.ValueType.cells, numbered from `base`, read by the value
                      type's loop automaton, left by an ending byte (the closing quote) into
                      `exits[byte]`, an explicit state

so that every state id is either explicit or a block cell. `start` is where a call begins; the
table builder adds the `done` state (after a stop token) as id `num_states`.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..grammar.values import ValueType, close_ok, stays_need
from ..select import pick
from .nfa import GrammarBuildError

MAX_BYTE_ROWS = 4_000_000   # rows of byte_table's delta (int32 [rows, byte classes]; the walk reads int64 copies)


@contextmanager
def gc_paused():
    """The collector waits until the block ends. A compile makes hundreds of thousands of small tuples, dicts and
    arrays, none in a reference cycle that matters; with a large heap (a 150K tokenizer loaded) each full pass of
    the collector costs a tenth of a second or more, and a large schema's compile triggered several (about 1 s of
    7). Nested uses are one pause; whatever is garbage is collected as usual afterwards."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


@dataclass
class Block:
    """A value body: cells (n, q) for n units so far and sub-state q, then `exits`."""
    vt: ValueType
    min: int
    max: int
    base: int                       # id of the first cell
    local: np.ndarray               # int64 [max+1, Q]: cell (n, q)'s id less `base`, -1 where there is none
                                    # (shared by the blocks of one type and cap: read only)
    ns: np.ndarray                  # int64 [Nb]: count of each cell, in id order
    qs: np.ndarray                  # int64 [Nb]: sub-state of each cell
    exits: np.ndarray               # int64 [256]: the state after each ending byte, -1 for the others
    label: object = None            # what the block stands for (describe)
    entry_depth: int = 0            # the deepest count an explicit state's byte leads into
    saturates: int | None = None    # a value without a max (max is values.UNBOUNDED): its last row, where the
                                    # count stops (a move past it lands in it; values.py's module docstring)

    def saturated_grid(self, rows: int) -> np.ndarray:
        """int64 [rows, Q]: `local` padded to `rows` rows, each row past a saturating block's last one that row
        again (so a move read off the grid lands where the count stops), past a bounded block's cap -1."""
        g = np.full((rows, self.local.shape[1]), -1, dtype=np.int64)
        part = self.local[:rows]
        g[:len(part)] = part
        if self.saturates is not None and rows > len(part):
            g[len(part):] = self.local[self.saturates]
        return g

    def last_row_ids(self) -> np.ndarray:
        """int64 [Q]: the state ids of a saturating block's last row (its last Q cells: the row is full)."""
        Q = self.local.shape[1]
        return self.base + self.size - Q + np.arange(Q)

    @property
    def grid(self) -> np.ndarray:   # int64 [max+1, Q]: state id of cell (n, q), -1 where there is none
        return np.where(self.local >= 0, self.local + self.base, -1)

    @property
    def us(self) -> np.ndarray:     # the seed's name for the sub-states
        return self.qs

    @property
    def size(self) -> int:
        return len(self.ns)

    def check(self, where: str = "") -> None:
        """The ending bytes must not be bytes the value could also take where it may end."""
        clash = np.flatnonzero((self.exits >= 0) & self.vt.body_bytes_at_accept())
        if len(clash):
            raise ValueError(f"{where or 'a value'}: the byte {bytes([int(clash[0])])!r} may both continue and end "
                             f"a {self.vt.name} value (a string body must be followed by its closing quote)")


@dataclass
class Automaton:
    num_states: int                 # explicit states and block cells (the table builder adds `done`)
    start: int
    edges: np.ndarray               # int64 [E, 3]: (src, byte, dst) for explicit states
    blocks: list = field(default_factory=list)
    accepting: np.ndarray = None    # int64 [A]: states where the value is complete
    source: object = None           # has describe(state) -> list and finish_bytes(state) -> bytes
    utf8: bool = True
    byte_class: np.ndarray = None   # int64 [256]: bytes no state tells apart share a class (None: work it out)
    starts: list = None             # several grammars in one automaton: each one's start ([start] if None)
    # An explicit state beside block positions moves on some bytes exactly as one position's cell does; the table
    # builder reads those tokens from the cell's row instead of walking them (automaton/tree.py _moves_alone).
    edge_cell: np.ndarray = None    # int64 [E]: per edge, that block cell; -1 (or None: all) walked

    def describe(self, state: int) -> list:
        return self.source.describe(state)

    def finish_bytes(self, state: int) -> bytes:
        return self.source.finish_bytes(state)

    def value_types(self) -> list:
        """The distinct value types of the blocks, in first-use order."""
        return list({b.vt.name: b.vt for b in self.blocks}.values())


def byte_classes(aut: Automaton) -> np.ndarray:
    """int64 [256]: a class per byte, equal for bytes every explicit state, value type and exit treats alike."""
    if aut.byte_class is not None:
        return aut.byte_class
    e = aut.edges
    srcs, src_col = np.unique(e[:, 0], return_inverse=True)
    cols = [np.full((256, len(srcs)), -1, dtype=np.int64)]
    cols[0][e[:, 1], src_col.reshape(-1)] = e[:, 2]
    for vt in {b.vt.name: b.vt for b in aut.blocks}.values():
        cols += [vt.table.T, vt.inc.T]
    if aut.blocks:
        cols.append(np.stack([b.exits for b in aut.blocks], 1))
    return row_classes(np.concatenate(cols, 1))


def row_classes(rows: np.ndarray) -> np.ndarray:
    """int64 [N]: a class per row of the integer [N, M] `rows`, numbered in the rows' lexicographic order.

    The same ids as np.unique(rows, axis=0, return_inverse=True), which sorts structured rows and
    costs ~3 ms for 256 bytes x 100 columns; one lexsort is ~0.1 ms.
    """
    N = rows.shape[0]
    if N == 0 or rows.shape[1] == 0:
        return np.zeros(N, dtype=np.int64)
    order = np.lexsort(rows.T[::-1])                       # first column most significant
    srt = rows[order]
    new = np.ones(N, dtype=bool)
    new[1:] = (srt[1:] != srt[:-1]).any(1)
    out = np.empty(N, dtype=np.int64)
    out[order] = np.cumsum(new) - 1
    return out


def _entry_tails(aut: Automaton, tails: np.ndarray) -> np.ndarray:
    """int64 [B]: per block, the most bytes a token can still hold after a byte that enters the block
    (an explicit state's edge or another block's exit into one of its cells); -1 if no byte enters it."""
    B = len(aut.blocks)
    out = np.full(B, -1, dtype=np.int64)
    if not B:
        return out
    bases = np.array([b.base for b in aut.blocks], dtype=np.int64)
    order = np.argsort(bases)
    lo, hi = bases[order], bases[order] + np.array([aut.blocks[k].size for k in order], dtype=np.int64)
    e = np.asarray(aut.edges).reshape(-1, 3)
    dst = [e[:, 2]] + [b.exits[b.exits >= 0] for b in aut.blocks]
    via = [e[:, 1]] + [np.flatnonzero(b.exits >= 0) for b in aut.blocks]
    dst, via = np.concatenate(dst).astype(np.int64), np.concatenate(via).astype(np.int64)
    at = np.searchsorted(lo, dst, side="right") - 1                      # the block whose ids could hold dst
    inside = (at >= 0) & (dst < hi[np.maximum(at, 0)])
    np.maximum.at(out, order[at[inside]], tails[via[inside]])
    return out


def explicit_states(aut: Automaton) -> np.ndarray:
    """int64 [E]: the states that are not block cells, ascending (blocks are ranges of ids: no per-state pass)."""
    S = aut.num_states
    if not aut.blocks:
        return np.arange(S)
    bounds = np.array(sorted((b.base, b.base + b.size) for b in aut.blocks), dtype=np.int64)     # [B, 2]
    gaps = np.stack([np.concatenate([[0], bounds[:, 1]]), np.concatenate([bounds[:, 0], [S]])], 1)  # [B + 1, 2]
    gaps = gaps[gaps[:, 1] > gaps[:, 0]]
    n = gaps[:, 1] - gaps[:, 0]
    return np.repeat(gaps[:, 0] - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(int(n.sum()))


def byte_table(aut: Automaton, token_len: int, tails: np.ndarray | None = None):
    """The transitions of the states a token's bytes can reach from an explicit state, per byte class.

    Returns (delta int32 [Sc, K] in compact ids, -1 illegal; byte_class int64 [256]; to_compact
    int32 [S], -1 for states left out; from_compact int64 [Sc]). A token of at most `token_len`
    bytes that enters a block at count n never gets past count n + token_len - 1, so each block
    needs rows only that deep; the deeper cells are handled by the table builder's per-token
    arithmetic instead. The table thus stays small whatever a value's cap is. With `tails`
    (int64 [256], tokensim.FlatVocab.max_tail: the most bytes any token has after each byte
    value) the bound is per block: a token enters it by one of its entry bytes b and adds at most
    tails[b] units after it (a unit takes at least one byte), so its rows go entry_depth + tails[b]
    deep (a quote is followed by a few bytes in any vocabulary, the longest token by many).
    """
    S = aut.num_states
    byte_class = byte_classes(aut)
    K = int(byte_class.max()) + 1
    rep = np.zeros(K, dtype=np.int64)
    rep[byte_class[::-1]] = np.arange(255, -1, -1)            # one byte per class (any will do)
    depth, kept = [], []                                       # per block: how deep its rows go, cells kept
    after = _entry_tails(aut, tails) if tails is not None else [max(token_len, 1) - 1] * len(aut.blocks)
    for blk, t in zip(aut.blocks, after):
        deep = blk.entry_depth + 1 + max(int(t), 0)
        depth.append(blk.saturates + 1 if blk.saturates is not None else min(blk.max + 1, deep))
        kept.append(int(np.searchsorted(blk.ns, depth[-1])))  # cells are in count order: the first ones
    explicit = explicit_states(aut)
    if len(explicit) + sum(kept) > MAX_BYTE_ROWS:
        raise GrammarBuildError(
            f"grammar: more than {MAX_BYTE_ROWS} states a token's bytes can reach ({len(explicit)} explicit, the "
            f"first rows of {len(aut.blocks)} values): too many values written out again for every array item "
            "and property; lower maxItems")
    from_compact = np.concatenate([explicit] + [blk.base + np.arange(k) for blk, k in zip(aut.blocks, kept)]) \
        if aut.blocks else explicit
    from_compact.sort()
    to_compact = np.full(S + 1, -1, dtype=np.int32)          # index S (= -1 wrapped) stays -1
    to_compact[from_compact] = np.arange(len(from_compact))
    delta = np.full((len(from_compact), K), -1, dtype=np.int32)
    e = aut.edges
    if len(e):
        delta[to_compact[e[:, 0]], byte_class[e[:, 1]]] = to_compact[e[:, 2]]
    # Block rows: all blocks of one value type at once. What a byte class does from a sub-state is
    # worked out once per type on [Q, K]; per cell only the count and the block's cap enter.
    by_type: dict = {}
    for k, blk in enumerate(aut.blocks):
        by_type.setdefault(blk.vt.name, []).append(k)
    for ks in by_type.values():
        blocks = [aut.blocks[k] for k in ks]
        vt = blocks[0].vt
        Q = vt.num_substates
        q2, inc = vt.table[:, rep], vt.inc[:, rep]                          # [Q, K] sub-state, units after each class
        need = stays_need(vt, q2, inc)                                      # [Q, K] stays_ok iff max - n >= need
        # a small dtype for the [N, K] compare: needs (and budgets) clipped to `cap`, which no legal need reaches
        dt = np.int16 if int(need[q2 >= 0].max(initial=0)) < np.iinfo(np.int16).max - 1 else np.int64
        cap = dt(np.iinfo(dt).max)
        need = np.minimum(need, cap).astype(dt)
        step = inc * Q + np.maximum(q2, 0)                                  # grid offset of the target cell
        rows_up = int(inc.max(initial=0)) + 1                               # grid rows a kept cell may reach past n
        cells, grids, gstart, nb = [], [], [0], []
        for k, b in zip(ks, blocks):
            n = kept[k]                                                     # its first n cells
            cells.append(np.stack([b.base + np.arange(n), b.ns[:n], b.qs[:n]]))
            nb.append(n)
            # the grid rows a kept cell can reach (compact ids), padded with illegal rows past the cap
            top = min(depth[k], b.max + 1) + rows_up
            g = b.saturated_grid(top)
            g = np.where(g >= 0, g + b.base, -1)
            grids.append(to_compact[g.reshape(-1)])                          # int32
            gstart.append(gstart[-1] + top * Q)
        j = np.repeat(np.arange(len(ks)), nb)                               # [N] block (within the type) of each cell
        ids, ns, qs = np.concatenate(cells, 1)
        lo, hi = (np.array([getattr(b, f) for b in blocks], dtype=np.int64)[j] for f in ("min", "max"))   # [N]
        grid = np.concatenate(grids)
        rows = to_compact[ids]                                              # [N]
        ok = need[qs] <= np.minimum(hi - ns, cap - 1).astype(dt)[:, None]     # [N, K] stays_ok
        at = step[qs]                                                       # [N, K] int64: no cast inside take
        at += (np.asarray(gstart[:-1])[j] + ns * Q)[:, None]                # in place: one [N, K] buffer, not two
        target = grid.take(at)
        delta[rows] = pick(ok, target, np.int32(-1))                    # no branch per entry (batchmask/select.py)
        ends = np.flatnonzero(close_ok(vt, ns, qs, lo, hi))
        if len(ends):
            exits = np.stack([b.exits[rep] for b in blocks])[j[ends]]      # [Ne, K] the state after each ending byte
            cur = delta[rows[ends]]
            delta[rows[ends]] = np.where(exits >= 0, to_compact[exits], cur)
    return delta, byte_class, to_compact[:S], from_compact
