"""What a subset construction found (automaton/tree.py in Python, automaton/native.py in C) -> the common form.

Both constructions hand over a `Found`: the explicit states (their NFA elements, for describe and finish), the
edges between them by byte class, the lone block positions they lead into, each block's exits and the classes
one block position moves on alone. `layout` numbers the block cells after the explicit states, spreads the
classes to their bytes and resolves every target code (an explicit id, or -1 - k for the k-th lone block position)
to a state id: all of it vectorised, so the two constructions share every step after the search.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..grammar.values import UNBOUNDED
from .form import Automaton, Block
from .nfa import GrammarBuildError
from .source import NodeSource

MAX_STATES = 20_000_000     # explicit states and block cells: the table's state_row is 4 bytes a state


@dataclass
class Found:
    """A subset construction's result; every array int64. Target codes: >= 0 an explicit state, -1 - k the
    k-th lone block position."""
    states: object                  # explicit states' elements, in id order: a sequence of tuples (NFA state ids,
                                    # and (j, n, q) for block j's cell (n, q))
    starts: list                    # per tree: its start's target code
    edges: tuple                    # (src, class, target code) [E] each: explicit states' moves, src ascending
    lone: np.ndarray                # [P, 3] (j, n, q) of the k-th lone block position
    entry_depth: dict               # block state j -> the deepest count a move enters it at
    exits: tuple                    # (j, class, target code) [X] each: the move after block j's value ends
    delegated: tuple                # (state, j, n, q, class) [D] each: the classes a position moves on alone
    accepting: np.ndarray           # [A] explicit states that hold the NFA's end


def layout(sub, found: Found) -> Automaton:
    """The Automaton of a construction over `sub` (tree.py _Subsets: its NFA, value types and byte classes)."""
    nfa, E = sub.nfa, len(found.states)
    blocks, block_of = [], {}
    base = E
    js = sorted(found.entry_depth)
    exits = np.full((len(js), 256), -1, dtype=np.int64)         # each block's exits: a row of one array
    for b, j in enumerate(js):
        vname, lo, hi = nfa.arg[j]
        vt = sub.vts[vname]
        local, ns, qs = vt.local_cells(hi) if hi is not None else vt.saturated_cells(lo)
        blk = Block(vt, lo, UNBOUNDED if hi is None else hi, base, local, ns, qs, exits[b],
                    label=(vname, lo, hi, j), entry_depth=found.entry_depth[j],
                    saturates=None if hi is not None else vt.saturation_row(lo))
        block_of[j] = blk
        blocks.append(blk)
        base += blk.size
    if base > MAX_STATES:
        raise GrammarBuildError(
            f"grammar: more than {MAX_STATES} states ({len(blocks)} string values of {base - E} cells in "
            "all: long strings written out again for every array item and property); lower maxLength or "
            "maxItems")
    js = np.array(js, dtype=np.int64)
    cell = np.append(_cells(blocks, js, *found.lone.T), -1)      # lone position k -> its cell's state id

    def resolve(t: np.ndarray) -> np.ndarray:                    # target codes -> state ids
        return np.where(t >= 0, t, cell[np.maximum(-1 - t, 0)])

    # (state, class, target) -> (state, byte, target): each class spread to its bytes
    byte_class = sub.byte_class
    order = np.argsort(byte_class, kind="stable")                                # bytes grouped by class
    size = np.bincount(byte_class, minlength=sub.num_classes)
    first = np.cumsum(size) - size
    src, cls, tgt = found.edges
    e = np.stack([src, cls, resolve(tgt)], 1) if len(src) else np.zeros((0, 3), dtype=np.int64)
    reps = size[e[:, 1]]
    k = np.repeat(np.arange(len(e)), reps)
    rank = np.arange(len(k)) - np.repeat(np.cumsum(reps) - reps, reps)
    edges = np.stack([e[k, 0], order[first[e[k, 1]] + rank], e[k, 2]], 1)
    edge_cell = _delegates(sub.num_classes, blocks, js, found.delegated, e)[k]
    xj, xc, xt = found.exits
    if len(xj):
        rk = np.repeat(np.arange(len(xj)), size[xc])                     # each exit's class spread to its bytes
        byte = order[first[xc[rk]] + np.arange(len(rk)) - np.repeat(np.cumsum(size[xc]) - size[xc], size[xc])]
        exits[np.searchsorted(js, xj)[rk], byte] = resolve(xt)[rk]
    for j in found.entry_depth:                                  # in the order the blocks were first entered
        block_of[j].check(f"grammar: {block_of[j].vt.name} value")
    src = NodeSource(nfa, found.states, blocks, sub.vts)
    starts = resolve(np.asarray(found.starts, dtype=np.int64)).tolist()
    return Automaton(num_states=base, start=starts[0], edges=edges, blocks=blocks,
                     accepting=np.asarray(found.accepting, dtype=np.int64), source=src, utf8=nfa.utf8,
                     byte_class=byte_class.astype(np.int64), starts=starts, edge_cell=edge_cell)


def _cells(blocks: list, js: np.ndarray, j: np.ndarray, n: np.ndarray, q: np.ndarray) -> np.ndarray:
    """int64 [P]: the state id of block j's cell (n, q) per position, -1 where there is none (a block never entered
    alone, a count past its grid). blocks: in the order of their NFA states js (ascending). One pass per distinct
    cell layout (blocks of one type and cap share theirs), not per block."""
    out = np.full(len(j), -1, dtype=np.int64)
    if not len(j) or not len(js):
        return out
    b = np.minimum(np.searchsorted(js, j), len(js) - 1)
    known = js[b] == j
    layouts: dict = {}
    for k, blk in enumerate(blocks):
        layouts.setdefault(id(blk.local), (blk.local, []))[1].append(k)
    of = np.zeros(len(blocks), dtype=np.int64)
    bases = np.array([blk.base for blk in blocks], dtype=np.int64)
    for g, (_, ks) in enumerate(layouts.values()):
        of[ks] = g
    for g, (local, _) in enumerate(layouts.values()):
        at = np.flatnonzero(known & (of[b] == g) & (n < local.shape[0]))
        loc = local[n[at], q[at]]
        out[at] = np.where(loc >= 0, loc + bases[b[at]], -1)
    return out


def _delegates(num_classes: int, blocks: list, js: np.ndarray, delegated: tuple, e: np.ndarray) -> np.ndarray:
    """int64 [len(e)]: for each (state, class, target) edge of `e`, the block cell whose moves the tokens
    starting with its bytes take (tree.py `_moves_alone`), -1 for the edges the table builder walks."""
    i, j, n, q, c = delegated
    cells = _cells(blocks, js, j, n, q)
    keep = cells >= 0
    keys, cells = i[keep] * num_classes + c[keep], cells[keep]
    out = np.full(len(e), -1, dtype=np.int64)
    if len(keys):
        order = np.argsort(keys)
        keys, cells = keys[order], cells[order]
        mine = e[:, 0] * num_classes + e[:, 1]
        at = np.minimum(np.searchsorted(keys, mine), len(keys) - 1)
        out = np.where(keys[at] == mine, cells[at], -1)
    return out
