"""The value rules' fast forms agree with their plain statements; row_classes agrees with np.unique."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from batchmask.automaton.form import row_classes
from batchmask.grammar.values import close_ok, stays_need, stays_ok, value_type

TYPES = [value_type(k, u) for k in ("seed", "json") for u in (True, False)]


def test_stays_and_close_match_their_statements():
    n = np.arange(0, 12)[:, None, None]
    for vt in TYPES:
        Q = vt.num_substates
        q2 = np.arange(-1, Q)[None, :, None]
        for max_ in (0, 1, 3, 7):
            plain = (q2 >= 0) & (n + vt.pending[np.maximum(q2, 0)] <= max_)  # values.py's stays_ok, as written
            assert np.array_equal(stays_ok(vt, n, q2, max_), plain)
            tv = vt.on("cpu")
            assert torch.equal(stays_ok(tv, torch.as_tensor(n), torch.as_tensor(q2), max_), torch.as_tensor(plain))
            for inc in (0, 1):
                need = stays_need(vt, q2[0, :, 0], np.full(Q + 1, inc))
                assert np.array_equal(max_ - n[:, 0] >= need[None, :], stays_ok(vt, n[:, 0] + inc, q2[0, :, 0], max_))
                got = stays_need(tv, torch.as_tensor(q2[0, :, 0]), torch.full((Q + 1,), inc))
                assert torch.equal(got, torch.as_tensor(need))
        q = np.arange(Q)[None, :]
        for lo, hi in ((0, 5), (2, 3), (4, 4)):
            plain = vt.accept[q] & (n[:, 0] >= lo) & (n[:, 0] <= hi)
            assert np.array_equal(close_ok(vt, n[:, 0], q, lo, hi), plain)
            got = close_ok(vt.on("cpu"), torch.as_tensor(n[:, 0]), torch.as_tensor(q), lo, hi)
            assert torch.equal(got, torch.as_tensor(plain))


def test_row_classes_match_numpy_unique():
    rng = np.random.default_rng(0)
    for shape, hi in (((256, 5), 3), ((256, 100), 2), ((40, 3), 1000), ((7, 1), 2)):
        rows = rng.integers(-1, hi, size=(shape[0] // 2 + 1, shape[1]))[rng.integers(0, shape[0] // 2 + 1, shape[0])]
        want = np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1)
        assert np.array_equal(row_classes(rows), want)


def test_cells_numbering_and_kept_layouts(monkeypatch):
    from batchmask.grammar import values
    monkeypatch.setattr(values, "CELLS_KEPT", 2)
    for vt in TYPES:
        for max_, base in ((0, 0), (3, 7), (5, 100), (3, 1), (9, 0), (3, 7)):        # caps repeat, and get evicted
            grid, ns, qs = vt.cells(max_, base)
            want, nxt = np.full((max_ + 1, vt.num_substates), -1), base     # row by row, rank order, if it exists
            for n in range(max_ + 1):
                for q in sorted(range(vt.num_substates), key=lambda q: vt.rank[q]):
                    if n >= vt.lo[q] and n + vt.pending[q] <= max_:
                        want[n, q], nxt = nxt, nxt + 1
            assert np.array_equal(grid, want)
            cells = np.argwhere(want >= 0)
            order = np.argsort(want[want >= 0])
            assert np.array_equal(ns, cells[order, 0]) and np.array_equal(qs, cells[order, 1])
            with pytest.raises(ValueError, match="read-only"):          # shared with the kept layout: not
                ns[:] = -5                                              # to be written (blocks only read it)
            grid[:] = -5                                        # the grid is the caller's own
        assert len(vt._torch["cells"]) == 2
