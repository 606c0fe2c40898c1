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

The search runs in C where the automaton's helpers are built (automaton/native.py); `_Subsets.run_python` is the
reference it is checked against and the path without them. Either hands a `layout.Found` to `layout.layout`.
"""
from __future__ import annotations

from collections import deque
from itertools import repeat

import numpy as np

from ..grammar.values import UNBOUNDED, close_ok, stays_ok, value_type_named
from . import extension, native
from .form import Automaton, gc_paused, row_classes
from .layout import MAX_STATES, Found, layout
from .nfa import ALT, BLOCK, BYTE, MAX_NFA, NFA, GrammarBuildError

__all__ = ["build_node_automaton", "GrammarBuildError", "MAX_EXPLICIT", "MAX_PARALLEL", "MAX_STATES"]

MAX_EXPLICIT = 200_000
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


def _refusal(verdict: int) -> GrammarBuildError:
    """The error of a construction that went past a limit (1, 2, 3: native.run's verdicts)."""
    if verdict == native.TOO_PARALLEL:
        return _TooParallel(
            f"grammar: two different strings stay open side by side for more than {MAX_PARALLEL} "
            "states (e.g. anyOf of long strings that differ only later); merge those anyOf branches")
    if verdict == native.TOO_MANY_EXPLICIT:
        return GrammarBuildError(
            f"grammar: more than {MAX_EXPLICIT} explicit states (repeats that multiply, or very long "
            "alternatives); simplify the schema")
    return NFA.too_large()


class _Subsets:
    """Subset construction over byte classes (see the module docstring)."""

    def __init__(self, nfa: NFA, starts: list[int]):
        self.nfa = nfa
        self.starts = starts
        self.vts = {}
        kinds = np.frombuffer(bytes(nfa.kind), dtype=np.uint8)         # kinds are 0..3: one pass in C, not Python
        self.block_states = np.flatnonzero(kinds == BLOCK)
        for i in self.block_states.tolist():
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
        self.mask_cut = np.searchsorted(m, np.arange(len(in_mask) + 1))   # mask i's classes: c[cut[i]:cut[i + 1]]
        self.mask_class_list = c
        self.mask_classes = None                                         # tuples, made for the Python construction
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
        """The construction in C where it is built (automaton/native.py), else in Python; the same result."""
        found = native.run(self, MAX_EXPLICIT, MAX_PARALLEL) if extension.helpers is not None else self.run_python()
        if isinstance(found, int):
            raise _refusal(found)
        return layout(self, found)

    def run_python(self) -> Found:
        nfa = self.nfa
        if self.mask_classes is None:
            cut, c = self.mask_cut.tolist(), self.mask_class_list.tolist()
            self.mask_classes = [tuple(c[a:b]) for a, b in zip(cut, cut[1:])]
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
                    raise _refusal(native.TOO_PARALLEL)
                if len(states) > MAX_EXPLICIT:
                    raise _refusal(native.TOO_MANY_EXPLICIT)
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
        i64 = np.int64
        exits = [(j, c, at) for j, moves in exit_edges.items() for c, at in moves]
        handed = [(i, *p, c) for i, found in delegated.items() for p, classes in found for c in classes]
        return Found(states=states, starts=starts,
                     edges=tuple(np.array(x, dtype=i64) for x in (src_l, cls_l, tgt_l)),
                     lone=np.array(list(positions), dtype=i64).reshape(-1, 3), entry_depth=blocks_seen,
                     exits=tuple(np.array(x, dtype=i64) for x in zip(*exits)) if exits else (np.zeros(0, i64),) * 3,
                     delegated=tuple(np.array(x, dtype=i64) for x in zip(*handed)) if handed
                     else (np.zeros(0, i64),) * 5,
                     accepting=np.array([i for i, el in enumerate(states) if nfa.end in el], dtype=i64))

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
