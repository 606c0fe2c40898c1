"""The table written from its compact parts (batchmask/table/write.py) against the same table written out plainly.

A reference built the obvious way: every row as a dense list of codes, equal rows found by a dict, equal columns
by another, legal ids counted token by token. The parts must give a table that is entry for entry the same
function (row of each input row, class of each token), with no two rows or columns equal, and the same counts;
sparse_classes and refine (table/classes.py) are checked against a dict of entry sets, on both paths (the compiled
helper and the numpy/torch reference; the reference with and without forced hash collisions)."""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchmask.table import classes
from batchmask.table.classes import sparse_classes
from batchmask.table.native import helpers as NATIVE
from batchmask.table.write import RowParts

PATHS = [pytest.param("native", marks=pytest.mark.skipif(NATIVE is None, reason="table/native_c/ is not built")),
         "reference"]


@contextlib.contextmanager
def grouping_path(name: str):
    """classes.py's grouping helpers on the compiled path or on the numpy/torch reference."""
    old = classes.helpers
    classes.helpers = NATIVE if name == "native" else None
    try:
        yield
    finally:
        classes.helpers = old


@st.composite
def parts(draw):
    """Random RowParts: sparse rows over C classes, dense rows over Cd value columns, tokens over classes."""
    C = draw(st.integers(1, 9))
    Cd = draw(st.integers(1, C))
    # every dense column is some class's (as the compiler's value classes are)
    extra = [draw(st.integers(0, Cd - 1)) for _ in range(C - Cd)]
    spread = torch.tensor(draw(st.permutations(list(range(Cd)) + extra)))
    n_sparse = draw(st.integers(0, 8))
    codes = st.sampled_from([-9, -3, -2, 0, 1, 2, 40000])      # relative, absolute, a wide one (int32 table)
    entries = {}
    for r in range(n_sparse):
        for c in range(C):
            if draw(st.booleans()):
                entries[(r, c)] = draw(codes)
    Rd = draw(st.integers(0, 6))
    dense = torch.tensor([[draw(st.one_of(st.just(-1), codes)) for _ in range(Cd)] for _ in range(Rd)],
                         dtype=torch.int32).reshape(Rd, Cd)
    if draw(st.booleans()) and n_sparse and Rd:               # a dense row equal to a sparse one, written out
        row = [entries.get((0, c), -1) for c in range(C)]
        if all(row[c] == row[c2] for c in range(C) for c2 in range(C) if spread[c] == spread[c2]):
            dense[0] = torch.tensor([next(row[c] for c in range(C) if spread[c] == d) if (spread == d).any() else -1
                                     for d in range(Cd)], dtype=torch.int32)
    V = draw(st.integers(C, C + 6))
    token_class = torch.tensor(list(range(C)) + [draw(st.integers(0, C - 1)) for _ in range(V - C)])
    keys = sorted(entries)
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    p = RowParts(n_sparse, t([r for r, _ in keys]), t([c for _, c in keys]), t([entries[k] for k in keys]),
                 dense, spread, C)
    return p, entries, token_class


def plain_rows(p: RowParts, entries: dict) -> list[tuple]:
    rows = [tuple(entries.get((r, c), -1) for c in range(p.num_classes)) for r in range(p.n_sparse)]
    rows += [tuple(int(p.dense[j, int(p.spread[c])]) for c in range(p.num_classes)) for j in range(p.dense.shape[0])]
    return rows


@settings(max_examples=150, deadline=None)
@given(parts())
def test_written_table_is_the_plain_table(case):
    p, entries, token_class = case
    rows = plain_rows(p, entries)
    if not rows:
        return
    row_class = p.row_classes()
    # equal rows, equal classes; different rows, different classes
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (rows[i] == rows[j]) == (int(row_class[i]) == int(row_class[j])), (i, j)
    n = int(row_class.max()) + 1
    row_order = torch.randperm(n, generator=torch.Generator().manual_seed(n))       # any order of the classes
    out_class, table, legal = p.write(row_order, token_class)
    position = {int(k): r for r, k in enumerate(row_order.tolist())}
    for i, row in enumerate(rows):
        r = position[int(row_class[i])]
        assert [int(table[r, int(out_class[v])]) for v in range(len(token_class))] == \
               [row[int(token_class[v])] for v in range(len(token_class))], i
        assert int(legal[r]) == sum(row[int(token_class[v])] != -1 for v in range(len(token_class)))
    cols = [tuple(table[:, k].tolist()) for k in range(table.shape[1])]
    assert len(set(cols)) == len(cols)                              # equal columns merged
    assert len({tuple(x) for x in table.tolist()}) == table.shape[0]          # each row once
    first_use = [int(out_class[v]) for v in range(len(token_class))]
    assert sorted(set(first_use), key=first_use.index) == list(range(table.shape[1]))   # columns by first use
    lo, hi = min(min(r) for r in rows), max(max(r) for r in rows)
    assert table.dtype == (torch.int16 if -32768 <= lo and hi <= 32767 else torch.int32)


def entries_of(raw, n):
    """(item, col, val) int64 tensors from drawn triples: items below n, each (item, col) once (the first)."""
    seen, triples = set(), []
    for i, c, v in raw:
        if i < n and (i, c) not in seen:
            seen.add((i, c))
            triples.append((i, c, v))
    return tuple(torch.tensor([t[k] for t in triples], dtype=torch.int64) for k in range(3))


def sparse_reference(item, col, val, n):
    sets = [frozenset((c, v) for i2, c, v in zip(item, col, val) if i2 == i) for i in range(n)]
    return sets


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), st.lists(st.tuples(st.integers(0, 11), st.integers(0, 5), st.integers(-3, 3)),
                                    max_size=40), st.booleans())
def test_sparse_classes_group_equal_entry_sets(path, n, raw, collide):
    item, col, val = entries_of(raw, n)
    mp = None
    if collide:          # the reference's entries all hash alike: only its exact check can tell the rows apart
        mp = classes._mix
        classes._mix = lambda x, m: torch.zeros_like(x)
    try:
        with grouping_path(path):
            ids = sparse_classes(item, col, val, n)
    finally:
        if mp is not None:
            classes._mix = mp
    ref = sparse_reference(item.tolist(), col.tolist(), val.tolist(), n)
    for a in range(n):
        for b in range(n):
            assert (ref[a] == ref[b]) == (int(ids[a]) == int(ids[b]))
        if any(not r for r in ref):                                  # items without entries: class 0
            assert (int(ids[a]) == 0) == (not ref[a])
    assert sorted(set(ids.tolist())) == list(range(int(ids.max()) + 1))      # dense ids


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=12),
       st.lists(st.tuples(st.integers(0, 11), st.integers(0, 4), st.integers(-2, 2)), max_size=40))
def test_refine_splits_classes_by_entries(path, base_ids, raw):
    base = torch.tensor(base_ids)
    base = torch.unique(base, return_inverse=True)[1]                        # dense ids, as refine expects
    V = len(base)
    item, col, val = entries_of(raw, V)
    with grouping_path(path):
        out = classes.refine(base, item, col, val)
    sets = sparse_reference(item.tolist(), col.tolist(), val.tolist(), V)
    key = [(int(base[i]), sets[i]) for i in range(V)]                       # the class of an id: both together
    for a in range(V):
        for b in range(V):
            assert (key[a] == key[b]) == (int(out[a]) == int(out[b]))
    assert sorted(set(out.tolist())) == list(range(int(out.max()) + 1))    # dense ids
