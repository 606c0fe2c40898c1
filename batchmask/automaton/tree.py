"""Any tree of grammar/nodes.py's nodes -> the automaton of automaton/form.py (NFA, then subset construction).

The NFA (automaton/nfa.py) is built right to left and hash-consed; its kinds are BYTE, ALT, BLOCK, END.

Subset construction runs over *elements*: an NFA state waiting for a byte, END, or a position
(j, n, q) inside block j. A subset that is exactly one block position is that block's cell (n, q):
the BFS stops there, and the block (laid out by values.ValueType.cells) carries on by arithmetic
in the table builder. Any other subset is an explicit state, also while a value runs beside
something else (an enum beside a free string); two values in parallel are explicit for as long
as they last, up to `MAX_PARALLEL` such states (then the build is refused with an error).
Bytes are handled in classes (bytes no NFA state and no value type tells apart), so a digit set
costs a few steps, not 256.
"""
from __future__ import annotations

from collections import deque
from itertools import repeat

import numpy as np

from ..grammar.values import UNBOUNDED, close_ok, stays_ok, value_type_named
from .form import Automaton, Block, gc_paused, row_classes
from .nfa import ALT, BLOCK, BYTE, MAX_NFA, NFA, GrammarBuildError
from .source import NodeSource

__all__ = ["build_node_automaton", "GrammarBuildError", "MAX_EXPLICIT", "MAX_PARALLEL", "MAX_STATES"]

MAX_EXPLICIT = 200_000
MAX_STATES = 20_000_000     # explicit states and block cells: the table's state_row is 4 bytes a state
MAX_PARALLEL = 5_000


def build_node_automaton(node, utf8: bool = True) -> Automaton:
    """The automaton of a grammar tree; of a list of trees, one automaton with a start state per tree
    (`starts`, in order): equal parts of the trees are the same NFA states, so the same states and rows."""
    trees = list(node) if isinstance(node, list) else [node]
    with gc_paused():                  # tens of thousands of small tuples and dicts (form.gc_paused)
        for runs in (True, False):
            nfa = NFA(utf8, runs=runs)
            nfa._closure = {}
            starts = []
            for k, t in enumerate(trees):
                nfa.limit = len(nfa.kind) + MAX_NFA                # per tree: a union of many tool sets is not one
                starts.append(nfa.build(t, nfa.end, "grammar" if len(trees) == 1 else f"grammar {k}"))
            try:
                sub = _Subsets(nfa, starts)
                aut = sub.run()
                # the build's memos (tens of thousands of small tuples, lists and dicts) are not read again
                # (describe and finish_bytes read the NFA's states and the value types): freed here, while the
                # collector waits, they are not traversed by its first pass after the build (~1 ms a catalogue)
                sub._trans = sub._exit_moves = None
                nfa._index = nfa._built = nfa._closure = None
                return aut
            except _TooParallel:
                # runs (automaton/runs.py) open side by side are parallel values; unrolled, they were not
                if not nfa.runs_made:
                    raise


class _TooParallel(GrammarBuildError):
    """More than MAX_PARALLEL explicit states hold two values at once."""


class _Subsets:
    """Subset construction over byte classes (see the module docstring)."""

    def __init__(self, nfa: NFA, starts: list[int]):
        self.nfa = nfa
        self.starts = starts
        self.vts = {}
        kinds = np.frombuffer(bytes(nfa.kind), dtype=np.uint8)         # kinds are 0..3: one pass in C, not Python
        for i in np.flatnonzero(kinds == BLOCK).tolist():
            name = nfa.arg[i][0]
            self.vts[name] = value_type_named(name, nfa.utf8)
        # Byte classes: bytes equal in every mask and in every value type's columns.
        cols = [np.frombuffer(b"".join(nfa.masks), dtype=np.uint8).reshape(-1, 256).astype(np.int64)]
        for vt in self.vts.values():
            cols += [vt.table, vt.inc]
        sig = np.concatenate(cols).T                                     # [256, K]
        self.byte_class = row_classes(sig)                               # numbered in lexicographic order
        self.num_classes = int(self.byte_class.max()) + 1
        self.rep = np.full(self.num_classes, 256, dtype=np.int64)
        np.minimum.at(self.rep, self.byte_class, np.arange(256))       # the smallest byte of each class
        in_mask = cols[0][:, self.rep] > 0                               # [M, classes]: classes refine masks
        m, c = np.nonzero(in_mask)                                       # row-major: each mask's classes ascending
        cut = np.searchsorted(m, np.arange(len(in_mask) + 1)).tolist()
        c = c.tolist()
        self.mask_classes = [tuple(c[a:b]) for a, b in zip(cut, cut[1:])]
        self._trans: dict = {}
        self._exit_moves: dict = {}

    def elem_moves(self, e) -> list:
        """[(classes, elements after them)] for one element, classes ascending: a byte set is one group (its
        classes share one target tuple), a block position a group per class."""
        got = self._trans.get(e)
        if got is not None:
            return got
        nfa = self.nfa
        out = []
        if isinstance(e, tuple):
            j, n, q = e
            vname, lo, hi = nfa.arg[j]
            vt = self.vts[vname]
            exit_moves = {}
            if hi is None:                                               # no max: the count stops at a row
                hi = UNBOUNDED
            if close_ok(vt, n, q, lo, hi):
                if j not in self._exit_moves:
                    self._exit_moves[j] = {c: t for cs, t in self.set_moves(nfa.closure(nfa.next[j])) for c in cs}
                exit_moves = self._exit_moves[j]
            q2s = vt.table[q, self.rep]                                  # every class at once
            n2s = n + vt.inc[q, self.rep]
            if hi == UNBOUNDED:
                n2s = np.minimum(n2s, vt.saturation_row(lo))
            stays = np.flatnonzero(stays_ok(vt, n2s, q2s, hi)).tolist()
            inside = dict(zip(stays, zip(n2s[stays].tolist(), q2s[stays].tolist())))
            for c in sorted(inside.keys() | exit_moves.keys()):
                tgt = ((j,) + inside[c],) if c in inside else ()
                if c in exit_moves:
                    tgt = tgt + exit_moves[c]
                if tgt:
                    out.append(((c,), tgt))
        elif nfa.kind[e] == BYTE:
            classes = self.mask_classes[nfa.arg[e]]
            out = [(classes, nfa.closure(nfa.next[e]))] if classes else []
        self._trans[e] = out
        return out

    def set_moves(self, elems) -> list:
        if len(elems) == 1 and not isinstance(elems[0], tuple):
            return self.elem_moves(elems[0])  # one byte set (most states): classes ascending, targets distinct
        buckets: dict = {}
        for e in elems:
            for cs, tgt in self.elem_moves(e):
                for c in cs:
                    got = buckets.get(c)
                    if got is None:
                        buckets[c] = [tgt]
                    else:
                        got.append(tgt)
        # classes whose targets come from the same elements' tuples (the same objects: a byte set's classes
        # share one) get one merged tuple, built once and shared; neighbouring classes that share it, one group
        out, made, last = [], {}, None
        for c in sorted(buckets):
            parts = buckets[c]
            key = tuple(map(id, parts))              # the parts stay alive (elem_moves keeps them): ids are theirs
            t = made.get(key)
            if t is None:
                t = made[key] = tuple(dict.fromkeys(x for part in parts for x in part))
            if t is last:
                out[-1][0].append(c)
            else:
                out.append(([c], t))
                last = t
        return out

    def merge_lockstep(self, elems: tuple) -> tuple:
        """Block positions of one value type, bounds and cell (n, q) move in lockstep until the value ends: they
        are one position of one block whose continuation is the Alt of theirs (an NFA state made here, hash-consed
        like the others), so an anyOf of objects that differ only after a string is a block, not explicit states
        for every cell of the string. Exact: the same moves inside, the union of the exits (set_moves)."""
        nfa, groups = self.nfa, {}
        for e in elems:
            if type(e) is tuple:
                j, n, q = e
                groups.setdefault((nfa.arg[j], n, q), []).append(j)
        if len(groups) == sum(type(e) is tuple for e in elems):
            return elems
        out, done = [], set()
        for e in elems:
            if type(e) is not tuple:
                out.append(e)
                continue
            key = (nfa.arg[e[0]],) + e[1:]
            if key in done:
                continue
            done.add(key)
            js = groups[key]
            if len(js) > 1:
                nexts = tuple(dict.fromkeys(nfa.next[j] for j in js))
                j = nfa._add(BLOCK, key[0], nexts[0] if len(nexts) == 1 else nfa._add(ALT, nexts, -1))
                e = (j,) + e[1:]
            out.append(e)
        return tuple(out)

    def run(self) -> Automaton:
        nfa = self.nfa
        states: list[tuple] = []              # explicit subsets, in priority order
        index: dict = {}
        queue: deque = deque()                # i >= 0: explicit state i; i < 0: the exits of NFA block -1 - i
        src_l, cls_l, tgt_l = [], [], []      # edges: (src explicit id, class, target)
        blocks_seen: dict[int, int] = {}      # NFA block state -> entry depth
        positions: dict = {}                  # block position (j, n, q) -> its target code -1 - k
        parallel = [0]                        # explicit states holding two or more string positions
        delegated: dict = {}                  # explicit id -> [(a block position, classes it moves on alone)]

        merge = self.merge_lockstep

        def target(elems: tuple) -> int:
            """An explicit state's id (made and queued when new), or -1 - k for the k-th block position."""
            if len(elems) > 1 and sum(type(e) is tuple for e in elems) > 1:
                elems = merge(elems)
            e0 = elems[0]
            if len(elems) == 1:
                if type(e0) is tuple:
                    got = positions.get(e0)
                    if got is None:
                        j, n, _ = e0
                        if j not in blocks_seen:
                            blocks_seen[j] = 0
                            queue.append(-1 - j)
                        blocks_seen[j] = max(blocks_seen[j], n)
                        got = positions[e0] = -1 - len(positions)
                    return got
                key = e0                                     # a lone element is its own key (no set to build)
            else:
                key = frozenset(elems)
            i = index.get(key)
            if i is None:
                i = index[key] = len(states)
                states.append(elems)
                queue.append(i)
                if len(elems) > 1 and sum(type(e) is tuple for e in elems) > 1:
                    parallel[0] += 1
                if parallel[0] > MAX_PARALLEL:
                    raise _TooParallel(
                        f"grammar: two different strings stay open side by side for more than {MAX_PARALLEL} "
                        "states (e.g. anyOf of long strings that differ only later); merge those anyOf branches")
                if len(states) > MAX_EXPLICIT:
                    raise GrammarBuildError(
                        f"grammar: more than {MAX_EXPLICIT} explicit states (repeats that multiply, or very long "
                        "alternatives); simplify the schema")
            return i

        starts = [target(nfa.closure(s)) for s in self.starts]
        exit_edges: dict[int, list] = {}
        trans, elem_moves, index_get = self._trans, self.elem_moves, index.get
        add_src, add_cls, add_tgt = src_l.append, cls_l.append, tgt_l.append
        ext_src, ext_cls, ext_tgt = src_l.extend, cls_l.extend, tgt_l.extend
        while queue:
            i = queue.popleft()
            if i >= 0:
                elems = states[i]
                e0 = elems[0]
                if len(elems) == 1 and type(e0) is int:          # one byte set (most states): its moves
                    moves = trans.get(e0)
                    if moves is None:
                        moves = elem_moves(e0)
                else:
                    moves = self.set_moves(elems)
                    if len(elems) > 1:
                        alone = self._moves_alone(elems, moves)
                        if alone is not None:
                            delegated[i] = alone
                for cs, tgt in moves:                  # a group of classes with one target: looked up once
                    t0 = tgt[0]
                    j = index_get(t0) if len(tgt) == 1 and type(t0) is int else None   # a lone byte set met before
                    at = j if j is not None else target(tgt)
                    k = len(cs)
                    if k == 1:
                        add_src(i)
                        add_cls(cs[0])
                        add_tgt(at)
                    else:
                        ext_src(repeat(i, k))
                        ext_cls(cs)
                        ext_tgt(repeat(at, k))
            else:
                j = -1 - i
                exit_edges[j] = [(c, at) for cs, tgt in self.set_moves(nfa.closure(nfa.next[j]))
                                 for at in (target(tgt),) for c in cs]
        return self._layout(states, starts, (src_l, cls_l, tgt_l), blocks_seen, list(positions), exit_edges,
                            delegated)

    def _moves_alone(self, elems: tuple, moves: list):
        """[(p, classes)] for a state that holds block positions beside other elements: per position p, the byte
        classes on which only p moves (the state's target is p's own). A token starting with such a byte goes
        exactly where it goes from p's cell, so the table builder reads it from that cell's row instead of walking
        every such token again from this state (a pattern's `(...)+` beside the string's end, a hostname's
        letter-first and digit-first labels: ten thousand tokens a copy)."""
        out = []
        for p in elems:
            if type(p) is tuple:
                own = {c: t for cs, t in self.elem_moves(p) for c in cs}
                classes = [c for cs, tgt in moves for c in cs if own.get(c) == tgt]
                if classes:
                    out.append((p, classes))
        return out or None

    def _layout(self, states, starts, edges_found, blocks_seen, positions, exit_edges, delegated) -> Automaton:
        nfa = self.nfa
        E = len(states)
        blocks, block_of = [], {}
        base = E
        for j in sorted(blocks_seen):
            vname, lo, hi = nfa.arg[j]
            vt = self.vts[vname]
            local, ns, qs = vt.local_cells(hi) if hi is not None else vt.saturated_cells(lo)
            blk = Block(vt, lo, UNBOUNDED if hi is None else hi, base, local, ns, qs, np.full(256, -1, dtype=np.int64),
                        label=(vname, lo, hi, j), entry_depth=blocks_seen[j],
                        saturates=None if hi is not None else vt.saturation_row(lo))
            block_of[j] = blk
            blocks.append(blk)
            base += blk.size
        if base > MAX_STATES:
            raise GrammarBuildError(
                f"grammar: more than {MAX_STATES} states ({len(blocks)} string values of {base - E} cells in "
                "all: long strings written out again for every array item and property); lower maxLength or "
                "maxItems")
        # target codes -> state ids: explicit ids as they are, -1 - k the cell of block position k
        cell = np.array([int(block_of[j].local[n, q]) + block_of[j].base for j, n, q in positions] + [-1],
                        dtype=np.int64)

        def resolve(t):                                  # int, or an int64 array of codes
            return np.where(t >= 0, t, cell[np.maximum(-1 - t, 0)]) if isinstance(t, np.ndarray) else \
                (t if t >= 0 else int(cell[-1 - t]))

        # (state, class, target) -> (state, byte, target): each class spread to its bytes
        order = np.argsort(self.byte_class, kind="stable")                      # bytes grouped by class
        size = np.bincount(self.byte_class, minlength=self.num_classes)
        first = np.cumsum(size) - size
        bytes_of = [order[f:f + n] for f, n in zip(first.tolist(), size.tolist())]
        e = np.zeros((len(edges_found[0]), 3), dtype=np.int64)
        if len(e):                             # column by column: numpy converts a list of ints fast
            e[:, 0], e[:, 1] = edges_found[0], edges_found[1]
            e[:, 2] = resolve(np.array(edges_found[2], dtype=np.int64))
        reps = size[e[:, 1]]
        k = np.repeat(np.arange(len(e)), reps)
        rank = np.arange(len(k)) - np.repeat(np.cumsum(reps) - reps, reps)
        edges = np.stack([e[k, 0], order[first[e[k, 1]] + rank], e[k, 2]], 1)
        edge_cell = self._delegates(delegated, block_of, e)[k]
        for j, moves in exit_edges.items():
            blk = block_of[j]
            for c, t in moves:
                blk.exits[bytes_of[c]] = resolve(t)
            blk.check(f"grammar: {blk.vt.name} value")
        accepting = np.array([i for i, el in enumerate(states) if nfa.end in el], dtype=np.int64)
        src = NodeSource(nfa, states, blocks, self.vts)
        return Automaton(num_states=base, start=resolve(starts[0]), edges=edges,
                         blocks=blocks, accepting=accepting, source=src, utf8=nfa.utf8,
                         byte_class=self.byte_class.astype(np.int64), starts=[resolve(s) for s in starts],
                         edge_cell=edge_cell)

    def _delegates(self, delegated: dict, block_of: dict, e: np.ndarray) -> np.ndarray:
        """int64 [len(e)]: for each (state, class, target) edge of `e`, the block cell whose moves the tokens
        starting with its bytes take (`_moves_alone`), -1 for the edges the table builder walks."""
        keys, cells = [], []
        for i, found in delegated.items():
            for (j, n, q), classes in found:
                blk = block_of.get(j)           # None: a block no state holds alone (it has no cells)
                if blk is not None and n < blk.local.shape[0] and blk.local[n, q] >= 0:
                    keys += [i * self.num_classes + c for c in classes]
                    cells += [int(blk.local[n, q]) + blk.base] * len(classes)
        out = np.full(len(e), -1, dtype=np.int64)
        if keys:
            keys, cells = np.array(keys, dtype=np.int64), np.array(cells, dtype=np.int64)
            order = np.argsort(keys)
            keys, cells = keys[order], cells[order]
            mine = e[:, 0] * self.num_classes + e[:, 1]
            at = np.minimum(np.searchsorted(keys, mine), len(keys) - 1)
            out = np.where(keys[at] == mine, cells[at], -1)
        return out

