"""A `Repeat` of a small byte-level item, compiled as a value block (a *run*) instead of unrolled states.

Unrolled, `Repeat(item, 0, n)` is n explicit states per distinct continuation, and each of them costs the
table builder work over every token its byte set lets through (a URI's path characters, a `pattern`'s
`[a-z0-9-]*`: ten thousand tokens a state, for every copy of the value an array holds). As a block its
positions are cells (n, q) read by arithmetic, and its tokens' effects are one signature per value type
(table/tokensim.py), as for a JSON string's body. The language is the same: the item is determinised into
a loop automaton (grammar/values.py `run_type`) whose units are the items, so the block's bounds are the
Repeat's, and a block needs only that what follows starts with single bytes the item cannot start with
(nfa.NFA._plain_end), which is where the item's end is then plain.

An item qualifies when it is bytes only (Lit, ByteSet, Seq, Alt, Repeat; no values), non-empty, small
(at most MAX_SUBSTATES sub-states) and prefix-free: once an item is complete no byte continues it, so a
complete item is the loop's boundary. A Repeat is made a run only where unrolling it would cost: no max (a
saturating run: its rows are shared wherever it is used, where a loop's states are one copy per place), or at
least RUN_MIN_REPEATS repetitions, of an item that starts with at least RUN_MIN_BYTES byte values (a digit run
stays explicit: a vocabulary has few digit tokens, and a new value type costs a signature per tokenizer).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..grammar.nodes import Alt, ByteSet, Lit, Repeat, Seq
from ..grammar.values import ValueType, run_type

MAX_SUBSTATES = 32         # sub-states of a run's loop automaton
MAX_ITEM_NODES = 256       # nodes of an item (unrolled repeats counted), beyond which it is not looked at
RUN_MIN_REPEATS = 4        # a Repeat's max, at least
RUN_MIN_BYTES = 16         # byte values that may start an item, at least

_MEMO: OrderedDict = OrderedDict()    # item node -> ValueType or None (nodes hash by value)
_MEMO_SIZE = 512


def worth_a_run(node: Repeat) -> bool:
    """A Repeat long enough to cost unrolled, or without a max: as a loop it is one explicit state per sub-state
    of its item, but one per place it is used (each left by ten thousand tokens), where a run's rows are shared."""
    return node.max is None or node.max >= RUN_MIN_REPEATS


def item_run_type(item, nfa_class, byte_kind: int) -> ValueType | None:
    """The run value type of a Repeat's item, or None if the item does not qualify (see the module docstring).
    nfa_class: nfa.NFA (passed in: nfa imports this module), byte_kind: its BYTE."""
    if not _small_bytes_only(item):      # first, and bounded: a memo lookup of a large item (an array's objects)
        return None                      # compares trees that share subtrees, which can take minutes
    try:
        got = _MEMO.pop(item)
    except (KeyError, TypeError):
        got = _item_type(item, nfa_class, byte_kind)
    try:
        _MEMO[item] = got
    except TypeError:
        return got
    while len(_MEMO) > _MEMO_SIZE:
        _MEMO.popitem(last=False)
    return got


def _small_bytes_only(item) -> bool:
    budget = [MAX_ITEM_NODES]

    def ok(n, times=1) -> bool:
        budget[0] -= times
        if budget[0] < 0:
            return False
        if isinstance(n, Lit):
            return isinstance(n.text, (bytes, bytearray))
        if isinstance(n, ByteSet):
            return True
        if isinstance(n, Seq):
            return all(ok(x, times) for x in n.items)
        if isinstance(n, Alt):
            return bool(n.options) and all(ok(x, times) for x in n.options)
        if isinstance(n, Repeat):
            if n.max is None:
                return isinstance(n.min, int) and n.min >= 0 and ok(n.item, times * max(n.min + 1, 1))
            return isinstance(n.max, int) and isinstance(n.min, int) and 0 <= n.min <= n.max \
                and ok(n.item, times * max(n.max, 1))
        return False
    return ok(item)


def _item_type(item, nfa_class, BYTE: int) -> ValueType | None:
    """Determinise the item (its own NFA, subset construction over bytes) into a loop automaton."""
    sub = nfa_class(True, runs=False)
    sub._closure = {}
    try:
        start = sub.build(item, sub.end, "run")
    except ValueError:                                  # GrammarBuildError: the full build will say why
        return None
    end = sub.end
    first = sub.closure(start)
    if end in first:
        return None                                     # an empty item: not a unit
    index = {frozenset(first): 0}
    subsets = [first]
    rows = []
    i = 0
    while i < len(subsets):
        elems = subsets[i]
        if any(sub.kind[e] != BYTE for e in elems):
            return None
        masks = np.frombuffer(b"".join(sub.masks[sub.arg[e]] for e in elems), dtype=np.uint8).reshape(len(elems), 256)
        row = np.full(256, -1, dtype=np.int64)
        groups: dict = {}
        for b in np.flatnonzero(masks.any(0)).tolist():
            key = tuple(np.flatnonzero(masks[:, b]).tolist())
            groups.setdefault(key, []).append(b)
        for key, bs in groups.items():
            tgt = tuple(dict.fromkeys(x for j in key for x in sub.closure(sub.next[elems[j]])))
            if end in tgt:
                if len(tgt) > 1:
                    return None                         # complete, yet it could go on: not prefix-free
                row[bs] = 0                             # the item is complete: back at the boundary
                continue
            k = index.get(frozenset(tgt))
            if k is None:
                k = index[frozenset(tgt)] = len(subsets)
                subsets.append(tgt)
                if len(subsets) > MAX_SUBSTATES:
                    return None
            row[bs] = k
        rows.append(row)
        i += 1
    table = np.stack(rows)
    if int((table[0] >= 0).sum()) < RUN_MIN_BYTES:
        return None
    try:
        return run_type(table)
    except ValueError:                                  # the item loops inside itself (`(\w+\.)+`): not a unit
        return None
