"""The compiled grouping helpers (batchmask/table/_grouping.c) against the numpy/torch reference in table/classes.py
and against plain Python: the same partitions on large random inputs (many rows per hash-table bucket), the same
tables from whole compiles, clear errors on bad arrays, and the switch that turns them off."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from batchmask.models.tokenizer import load_tokenizer
from data_paths import LLAMA2

from batchmask.api import compile_json_schema
from batchmask.table import classes
from batchmask.table.native import grouping as NATIVE
from batchmask.table.packed import row_codes

needs_native = pytest.mark.skipif(NATIVE is None, reason="table/_grouping.c is not built here")


def same_partition(a, b) -> bool:
    """Two id arrays group their items alike (ids may be numbered differently)."""
    a, b = np.asarray(a), np.asarray(b)
    pairs = np.unique(np.stack([a, b], 1), axis=0)
    return len(pairs) == len(np.unique(a)) == len(np.unique(b))


def python_refine(base, item, col, val):
    """The partition refine promises, by a dict: (base class, entry set) per id."""
    rows = [dict() for _ in range(len(base))]
    for i, c, v in zip(item, col, val):
        rows[i][c] = v
    key = {}
    return [key.setdefault((int(base[i]), frozenset(rows[i].items())), len(key)) for i in range(len(base))]


def random_entries(rng, V, P, cols, vals):
    """P distinct (item, col) pairs with values, over V items: many items share a row (few distinct rows)."""
    shapes = [(rng.choice(cols, size=rng.integers(1, 6), replace=False), rng.integers(-vals, vals, 6))
              for _ in range(max(1, P // 40))]
    item, col, val = [], [], []
    for i in rng.choice(V, size=min(V, P), replace=False):
        c, v = shapes[rng.integers(len(shapes))]
        item += [i] * len(c)
        col += c.tolist()
        val += v[:len(c)].tolist()
    return (torch.tensor(item, dtype=torch.int64), torch.tensor(col, dtype=torch.int64),
            torch.tensor(val, dtype=torch.int64))


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_built_where_a_compiler_is():
    """With a compiler at install time the extension is there (else the fast path would silently be missing)."""
    assert NATIVE is not None or os.environ.get("BATCHMASK_NATIVE") == "0"


@needs_native
@pytest.mark.parametrize("seed", range(4))
def test_refine_and_sparse_classes_match_the_reference(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    V = int(rng.integers(50, 20_000))
    base = torch.from_numpy(rng.integers(0, int(rng.integers(1, 40)), V))
    base = torch.unique(base, return_inverse=True)[1]
    item, col, val = random_entries(rng, V, int(rng.integers(0, V)), np.arange(300), 3)
    native = (classes.refine(base, item, col, val), classes.sparse_classes(item, col, val, V))
    monkeypatch.setattr(classes, "grouping", None)
    reference = (classes.refine(base, item, col, val), classes.sparse_classes(item, col, val, V))
    for got, want in zip(native, reference):
        assert same_partition(got.numpy(), want.numpy())
        assert sorted(set(got.tolist())) == list(range(int(got.max()) + 1))         # dense ids
    assert same_partition(native[0].numpy(), python_refine(base.tolist(), item.tolist(), col.tolist(), val.tolist()))
    empty = np.bincount(item.numpy(), minlength=V) == 0
    if empty.any():                                                                 # no entries: class 0
        assert np.array_equal(native[1].numpy() == 0, empty)


@needs_native
def test_rows_that_share_a_hash_bucket_are_told_apart_by_their_entries():
    """Rows alike but for one value, in one base class, and the same rows in two base classes: the hash table's
    probing must compare entries and base classes, not hashes."""
    V = 4096
    item = torch.arange(V).repeat_interleave(2)
    col = torch.tensor([0, 1]).repeat(V)
    val = torch.stack([torch.zeros(V, dtype=torch.int64), torch.arange(V) % 7], 1).reshape(-1)
    base = (torch.arange(V) // 1000) % 2
    got = classes.refine(base, item, col, val)
    assert same_partition(got.numpy(), python_refine(base.tolist(), item.tolist(), col.tolist(), val.tolist()))
    assert int(got.max()) + 1 == 14


@needs_native
def test_first_of_each_matches_a_scan():
    rng = np.random.default_rng(3)
    inv = rng.integers(0, 500, 100_000)
    inv[rng.choice(100_000, 500, replace=False)] = np.arange(500)                   # every id present
    want = np.full(500, -1)
    for i, c in enumerate(inv.tolist()):
        if want[c] < 0:
            want[c] = i
    assert classes.first_of_each(torch.from_numpy(inv)).tolist() == want.tolist()


@needs_native
def test_bad_arrays_are_named():
    ok = np.zeros(3, dtype=np.int64)
    with pytest.raises(TypeError, match="col: expected a C-contiguous int64 array"):
        NATIVE.refine(None, ok, np.zeros(3, dtype=np.int32), ok, np.empty(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"item\[1\] = 7 is outside \[0, 3\)"):
        NATIVE.refine(None, np.array([0, 7, 1]), ok, ok, np.empty(3, dtype=np.int64))
    with pytest.raises(ValueError, match="differ in length"):
        NATIVE.refine(None, ok, ok[:2], ok, np.empty(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"base\[0\] is negative"):
        NATIVE.refine(np.array([-1, 0, 0]), np.array([1]), np.array([0]), np.array([0]), np.empty(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"inverse\[2\] = -4 is negative"):
        NATIVE.first_of_each(np.array([0, 1, -4]))
    free, one = np.zeros(8, dtype=bool), np.ones(1, dtype=np.int64)
    with pytest.raises(ValueError, match=r"order\[0\] = 3 names no row's columns"):
        NATIVE.first_fit(free, free, np.array([3]), np.zeros(1, dtype=np.int64), one, one, np.empty(1, np.int64), 8)
    with pytest.raises(TypeError, match="used: expected a C-contiguous bool or uint8 array"):
        NATIVE.first_fit(free, np.zeros(8), np.array([0]), np.zeros(1, dtype=np.int64), one, one, one.copy(), 8)


@needs_native
def test_compiled_tables_equal_the_reference_paths(monkeypatch):
    """Whole compiles, every grouping on one path and then the other: the same tables, entry for entry."""
    tok = load_tokenizer(LLAMA2 / "tokenizer.model")
    schemas = [{"type": "object", "properties": {"a": {"type": "string", "maxLength": 12}, "b": {"type": "integer"},
                                                 "c": {"enum": ["red", "green", 3]}}, "required": ["a"]},
               {"type": "array", "items": {"anyOf": [{"type": "number"}, {"type": "string", "format": "date"}]},
                "maxItems": 4},
               {"type": "object", "properties": {"k": {"type": "string", "pattern": "^[a-z]{2,5}$"},
                                                 "n": {"type": "object", "properties": {"x": {"type": "boolean"}}}}}]

    def tables():
        out = []
        for s in schemas:
            g = compile_json_schema(s, tok)
            out.append((g.token_class, g.state_row, row_codes(g, torch.arange(g.num_rows)), g.targets))
        return out
    native = tables()
    monkeypatch.setattr(classes, "grouping", None)
    for got, want in zip(native, tables()):
        for a, b in zip(got, want):
            assert torch.equal(a, b)


def test_switched_off_by_the_environment():
    code = "from batchmask.table import classes, native; print(native.grouping is None, classes.grouping is None)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "BATCHMASK_NATIVE": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
