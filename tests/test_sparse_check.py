"""classes.sparse_classes's exact check by each of its three lookups (a (class, column) table over the raw
columns, over the columns renumbered to those in use, and a sorted list of the first items' entries),
against the entry sets themselves: the grouping must not depend on which one runs."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchmask.table import classes


def entry_sets(item, col, val, n):
    out = [set() for _ in range(n)]
    for i, c, v in zip(item, col, val):
        out[i].add((c, v))
    return out


@pytest.mark.parametrize("cells, spread", [(1 << 24, 1), (1 << 24, 100_000), (0, 1)])
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 10), raw=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 4), st.integers(-2, 2)),
                                          max_size=40), seed=st.integers(0, 3))
def test_sparse_classes_by_each_lookup(cells, spread, n, raw, seed):
    seen, triples = set(), []
    for i, c, v in raw:
        if i < n and (i, c) not in seen:
            seen.add((i, c))
            triples.append((i, c * spread, v))           # spread: columns far apart, so they are renumbered
    item, col, val = (torch.tensor([t[k] for t in triples], dtype=torch.int64) for k in range(3))
    # every item hashed alike but by its count: the exact check alone splits unequal rows of equal size,
    # and whenever it finds one it must say so (the dense fallback then groups them)
    calls = []
    real = classes._same_entries_as_first

    def spy(*a):
        calls.append(real(*a))
        return calls[-1]
    old = classes._LOOKUP_CELLS, classes._mix, classes._same_entries_as_first, classes.helpers
    # the numpy/torch reference's lookups (the compiled helper, table/native_c/, is checked in test_native.py)
    classes._LOOKUP_CELLS, classes._same_entries_as_first, classes.helpers = cells, spy, None
    if seed:
        classes._mix = lambda x, m: torch.zeros_like(x)
    try:
        ids = classes.sparse_classes(item, col, val, n)
    finally:
        classes._LOOKUP_CELLS, classes._mix, classes._same_entries_as_first, classes.helpers = old
    sets = entry_sets(item.tolist(), col.tolist(), val.tolist(), n)
    for a in range(n):
        for b in range(n):
            assert (sets[a] == sets[b]) == (int(ids[a]) == int(ids[b]))
    if calls and seed:                        # with colliding hashes the check is right about each class
        by_count = {}
        for a in range(n):
            if sets[a]:
                by_count.setdefault(len(sets[a]), set()).add(frozenset(sets[a]))
        assert calls[0] == all(len(v) == 1 for v in by_count.values())


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, 30), cols=st.integers(1, 100), density=st.floats(0, 1), seed=st.integers(0, 1000))
def test_unique_bool_rows_is_torch_unique(rows, cols, density, seed):
    """classes.unique_bool_rows against torch.unique(dim=0): the same distinct rows, in the same order, and the same
    index per row (blocks.py numbers its exit patterns by it, so tables depend on the order); rows of up to 64
    columns and of more take different paths."""
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(rows, cols, generator=g) < density
    want, want_inv = torch.unique(m, dim=0, return_inverse=True)
    got, got_inv = classes.unique_bool_rows(m)
    assert torch.equal(got, want) and torch.equal(got_inv, want_inv)
