"""table/classes.py groups rows and columns exactly: checked against a plain dict of row tuples."""
from __future__ import annotations

import torch

from batchmask.table.classes import _members_equal, classes_of, column_classes, first_of_each


def reference(rows: list[tuple]) -> tuple[list[int], list[int]]:
    """(first index of each item's group, sorted first indices), by exact tuple equality."""
    first: dict[tuple, int] = {}
    of = [first.setdefault(r, i) for i, r in enumerate(rows)]
    return of, sorted(first.values())


def check_rows(keys: torch.Tensor) -> None:
    inverse, rep = classes_of(keys)
    of, firsts = reference([tuple(r) for r in keys.tolist()])
    assert rep[inverse].tolist() == of                     # same grouping, each item to its group's first row
    assert sorted(rep.tolist()) == firsts
    assert torch.equal(first_of_each(inverse), rep)


def test_rows_every_branch():
    gen = torch.Generator().manual_seed(0)
    for lo, hi, dtype in [(-3, 4, torch.int32), (-1, 200_000, torch.int32),   # float64 matmul (signed keys)
                          (0, 1 << 34, torch.int64),                          # int64 multiply-and-sum
                          (-(1 << 50), 1 << 50, torch.int64)]:                # exact row sort
        for V, K in [(1, 1), (300, 1), (300, 2), (400, 7), (64, 300)]:
            base = torch.randint(lo, hi, (max(V // 4, 1), K), generator=gen, dtype=torch.int64)
            keys = base[torch.randint(0, len(base), (V,), generator=gen)].to(dtype)   # many repeats
            check_rows(keys)
    check_rows(torch.zeros((5, 0), dtype=torch.int64))
    assert classes_of(torch.zeros((0, 3), dtype=torch.int64))[0].numel() == 0


def test_columns_match_rows_of_transpose():
    gen = torch.Generator().manual_seed(1)
    for lo, hi in [(-2, 3), (-1, 150_000), (0, 1 << 45)]:
        base = torch.randint(lo, hi, (50, 40), generator=gen, dtype=torch.int64)
        m = base[:, torch.randint(0, 40, (120,), generator=gen)].to(torch.int32 if hi < (1 << 31) else torch.int64)
        inverse, rep = column_classes(m)
        of, firsts = reference([tuple(c) for c in m.T.tolist()])
        assert rep[inverse].tolist() == of
        assert sorted(rep.tolist()) == firsts


def test_collision_check_reads_shared_classes():
    keys = torch.tensor([[1, 2], [1, 2], [3, 4], [5, 6]])
    assert _members_equal(keys, torch.tensor([0, 0, 1, 2]), torch.tensor([0, 2, 3]))
    assert not _members_equal(keys, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2]))       # rows 2 and 3 differ
    assert not _members_equal(keys.T, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2]), dim=1)


def test_blocks_of_rows_give_the_same_grouping(monkeypatch):
    from batchmask.table import classes
    monkeypatch.setattr(classes, "_CHUNK", 64)                  # many small blocks of rows in the float64 products
    test_rows_every_branch()
    test_columns_match_rows_of_transpose()
