"""The subset construction in C (automaton/native_c/), when it is there: the same `Found` as tree.py's
`_Subsets.run_python`, state for state and edge for edge (tests/test_automaton_native.py checks one against the
other on many grammars).

It runs where extension.helpers is the built module; tree.py runs the Python construction where it is None.

The C side reads the NFA's lists as they are (kinds, continuations, each BYTE state's mask and each ALT state's
options), the value types' tables per byte class, and each mask's classes; it hands back int64 arrays, and the
NFA states its lockstep merge made, which are added here, in order, to the NFA (hash-consed as nfa.py would have:
the ids come out the same).
"""
from __future__ import annotations

import numpy as np

from ..grammar.values import UNBOUNDED
from . import extension
from .layout import Found
from .nfa import ALT, BLOCK

TOO_PARALLEL, TOO_MANY_EXPLICIT, TOO_MANY_NFA = 1, 2, 3          # the C side's verdicts (tree.py raises each)

__all__ = ["run", "TOO_PARALLEL", "TOO_MANY_EXPLICIT", "TOO_MANY_NFA"]


def run(sub, max_explicit: int, max_parallel: int):
    """The construction over tree.py's `_Subsets` `sub`: a Found, or a verdict (an int) past a limit."""
    nfa, i64 = sub.nfa, np.int64
    # block arguments (value type, min, max): one number each, and per argument its row of facts
    barg_of = np.full(len(nfa.kind), -1, dtype=i64)
    args: dict = {}
    for j in sub.block_states.tolist():
        barg_of[j] = args.setdefault(nfa.arg[j], len(args))
    names = {v: i for i, v in enumerate(sub.vts)}
    rows = []
    for vname, lo, hi in args:
        cap = UNBOUNDED if hi is None else hi
        sat = sub.vts[vname].saturation_row(lo) if cap == UNBOUNDED else -1
        rows.append((names[vname], lo, cap, sat))
    btab = np.array(rows, dtype=i64).reshape(-1, 4)
    rep = sub.rep
    vts = [sub.vts[v] for v in names]
    rows2, rows1 = [np.zeros((0, sub.num_classes), dtype=i64)], [np.zeros(0, dtype=i64)]    # no value types
    table = np.concatenate([vt.table[:, rep] for vt in vts] or rows2)
    inc = np.concatenate([vt.inc[:, rep] for vt in vts] or rows2)
    pending = np.concatenate([vt.pending * bool(vt.max_pending) for vt in vts] or rows1)   # 0 where never owed
    accept = np.concatenate([vt.accept for vt in vts] or rows1)
    vt_off = np.cumsum([0] + [vt.num_substates for vt in vts])
    got = extension.helpers.run(nfa.kind, nfa.next, nfa.arg, np.array(nfa.loops, dtype=i64), nfa.limit, nfa.end,
                                barg_of, btab, vt_off.astype(i64), np.ascontiguousarray(table, dtype=i64),
                                np.ascontiguousarray(inc, dtype=i64), pending.astype(i64), accept.astype(i64),
                                sub.mask_cut.astype(i64), sub.mask_class_list.astype(i64), sub.num_classes,
                                np.asarray(sub.starts, dtype=i64),
                                max_explicit, max_parallel)
    if isinstance(got, int):
        return got
    a = [np.frombuffer(x, dtype=i64) for x in got]
    (starts, src, cls, tgt, st_len, st_elems, pos, lone, seen, depth, xj, xc, xt, di, dp, dc, accepting,
     new_kind, new_next, new_arg, opts_n, opts) = a
    _add_merged(nfa, list(args), new_kind, new_next, new_arg, opts_n, opts)
    pos = pos.reshape(-1, 3)
    dpos = pos[dp]
    return Found(states=States(st_len, st_elems, pos), starts=starts.tolist(), edges=(src, cls, tgt),
                 lone=pos[lone], entry_depth=dict(zip(seen.tolist(), depth.tolist())), exits=(xj, xc, xt),
                 delegated=(di, dpos[:, 0], dpos[:, 1], dpos[:, 2], dc), accepting=accepting)


def _add_merged(nfa, args: list, kind, nxt, arg, opts_n, opts) -> None:
    """The NFA states the C side's lockstep merge made, added in order: each gets the id it was given there."""
    at, first = 0, len(nfa.kind)
    for k, (kd, n, a, m) in enumerate(zip(kind.tolist(), nxt.tolist(), arg.tolist(), opts_n.tolist())):
        if kd == BLOCK:
            got = nfa._add(BLOCK, args[a], n)
        else:
            assert kd == ALT
            got = nfa._add(ALT, tuple(opts[at:at + m].tolist()), -1)
            at += m
        if got != first + k:
            raise AssertionError(f"NFA state {first + k} from the C construction came out as {got}")


class States:
    """The explicit states' elements, decoded on demand (NodeSource reads a few; making every tuple would cost
    as much as the construction): state i is a tuple of NFA state ids and (j, n, q) block positions."""

    def __init__(self, lengths: np.ndarray, elems: np.ndarray, pos: np.ndarray):
        self.starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.elems, self.pos = elems, pos

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, i: int) -> tuple:
        if not 0 <= i < len(self):
            raise IndexError(f"explicit state {i} out of range")
        codes = self.elems[self.starts[i]:self.starts[i + 1]].tolist()
        return tuple(e if e >= 0 else tuple(self.pos[-1 - e].tolist()) for e in codes)
