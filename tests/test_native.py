"""The compiled helpers (batchmask/table/native_c/) against the numpy/torch reference in table/classes.py and
table/trie.py and against plain Python: the same partitions on large random inputs (many rows per hash-table
bucket), the same trie walk (finds, order, work counted, and refusal at the same budget), the same tables from whole
compiles, clear errors on bad arrays, and the switch that turns them off."""
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
from hypothesis import given, settings
from hypothesis import strategies as st

from batchmask.api import compile_json_schema
from batchmask.table import build, classes, packed, trie
from batchmask.table.native import helpers as NATIVE
from batchmask.table.packed import row_codes

needs_native = pytest.mark.skipif(NATIVE is None, reason="table/native_c/ is not built here")


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
    monkeypatch.setattr(classes, "helpers", None)
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
def test_signatures_equal_the_numpy_simulation(monkeypatch):
    """simulate (the signature's token runs in C) against the numpy simulation: every field of the Signature of the
    JSON and seed string types, and of the run and word types a schema with patterns and formats makes, equal."""
    from batchmask.automaton.tree import build_node_automaton
    from batchmask.grammar.values import value_type
    from batchmask.schema.build import schema_node
    from batchmask.table import signature
    from batchmask.table.tokensim import FlatVocab

    tok = load_tokenizer(LLAMA2 / "tokenizer.model")
    vocab = FlatVocab(list(tok.token_bytes), "cpu")
    schema = {"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^[a-z][a-z0-9_-]{2,30}$"}, "when": {"type": "string", "format": "date"},
        "mail": {"type": "string", "format": "email"}, "tags": {"type": "array", "items": {"type": "string"}}}}
    vts = [value_type(k, u) for k in ("json", "seed") for u in (True, False)]
    vts += build_node_automaton(schema_node(schema)).value_types()
    assert len({vt.name for vt in vts}) >= 6
    fields = ("packed", "ev_tok", "ev_pos", "ev_byte", "ev_key", "sig_id", "reach", "stop_q", "stop_t", "stop_ev")
    for vt in vts:
        got = signature.compute_signature(vt, vocab)
        with monkeypatch.context() as m:
            m.setattr(signature, "helpers", None)
            want = signature.compute_signature(vt, vocab)
        for f in fields:
            assert torch.equal(getattr(got, f), getattr(want, f)), (vt.name, f)
        assert got.L == want.L


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
    with pytest.raises(ValueError, match="every token inside flat"):
        NATIVE.simulate(np.full(256, -1), np.zeros(256, dtype=np.int64), np.ones(1, dtype=bool),
                        np.zeros(4, dtype=np.uint8), np.array([0, 3]), np.array([2, 2]))
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
    for module in (classes, trie, packed, build):                                  # every caller on its reference
        monkeypatch.setattr(module, "helpers", None)
    for got, want in zip(native, tables()):
        for a, b in zip(got, want):
            assert torch.equal(a, b)


def test_switched_off_by_the_environment():
    code = "from batchmask.table import classes, native; print(native.helpers is None, classes.helpers is None)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "BATCHMASK_NATIVE": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]


def _walk_both(tokens, delta, byte_class, src, byte, after, budget, monkeypatch):
    """(native result or "refused", reference result or "refused", the work each counted) of one walk."""
    from batchmask.table.tokensim import FlatVocab
    vt = FlatVocab(tokens, "cpu").trie
    out = []
    for helpers in (NATIVE, None):
        monkeypatch.setattr(trie, "helpers", helpers)
        with trie.pairs_budget(budget), trie.shared_budget():
            try:
                got = trie._walk_distinct(vt, delta, byte_class, src, byte, after, src)
                out.append((tuple(x.tolist() for x in got), trie._SPENT.get()[0]))
            except trie.GrammarBuildError:
                out.append("refused")
    return out


@needs_native
@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=6), min_size=1, max_size=60), st.integers(1, 8), st.randoms(),
       st.integers(1, 40))
def test_walk_is_the_reference_walk_and_refuses_at_the_same_budget(tokens, n_states, rnd, n_edges):
    from _pytest.monkeypatch import MonkeyPatch
    K = 5
    byte_class = np.array([rnd.randrange(K) for _ in range(256)], dtype=np.int64)
    delta = np.array([[rnd.choice([-1, *range(n_states)]) for _ in range(K)] for _ in range(n_states)], dtype=np.int32)
    firsts = sorted({t[0] for t in tokens}) + [rnd.randrange(256)]
    edges = [(i, rnd.choice(firsts), rnd.randrange(-1, n_states)) for i in range(n_edges)]
    src, byte, after = (np.array(x, dtype=np.int64) for x in zip(*edges))
    with MonkeyPatch.context() as mp:
        native, reference = _walk_both(tokens, delta, byte_class, src, byte, after, trie.MAX_PAIRS, mp)
        assert native == reference                                          # the same finds, in order, same work
        work = reference[1]
        if work:             # the least budget the reference walks under: the native walk refuses just below it too
            least = next(b for b in range(1, work + 1)
                         if _walk_both(tokens, delta, byte_class, src, byte, after, b, mp)[1] != "refused")
            below = _walk_both(tokens, delta, byte_class, src, byte, after, least - 1, mp)
            assert below[0] == below[1]
            assert _walk_both(tokens, delta, byte_class, src, byte, after, least, mp)[0] != "refused"


@needs_native
def test_walk_arrays_are_checked():
    from batchmask.table.tokensim import FlatVocab
    vt = FlatVocab([b"ab", b"a"], "cpu").trie
    delta = np.zeros((2, 3), dtype=np.int32)
    cls = np.zeros(256, dtype=np.int64)
    one = np.zeros(1, dtype=np.int64)
    with pytest.raises(TypeError, match="delta: expected a C-contiguous int32 array"):
        NATIVE.walk(*vt.flat, delta.astype(np.int64), 3, cls, vt.first, one, one, one, 10)
    with pytest.raises(ValueError, match=r"walk: delta\[0\] = 5 is not a state"):
        NATIVE.walk(*vt.flat, np.full((2, 3), 5, dtype=np.int32), 3, cls, vt.first, one, one, one, 10)
    with pytest.raises(ValueError, match=r"walk: after\[0\] = 9 is not a state"):
        NATIVE.walk(*vt.flat, delta, 3, cls, vt.first, one, one, one + 9, 10)
    vt.levels[0].child_n[:] = 99                                   # children past the trie's last node
    with pytest.raises(ValueError, match="a node points outside the trie"):
        _ = trie.VocabTrie(vt.levels, vt.first).flat


@needs_native
@pytest.mark.parametrize("seed", range(6))
def test_refine_walked_is_refine_over_the_moves(seed, monkeypatch):
    """Classes of a walk's finds without writing the moves out: the partition refine gives over Walked.moves(), and
    handed back exactly the moves of each class's first token."""
    rng = np.random.default_rng(seed)
    V, U = int(rng.integers(20, 3000)), int(rng.integers(1, 60))
    edge_n = rng.integers(1 if seed % 2 else 0, 5, U)                         # some pairs without edges
    edge_at = np.cumsum(edge_n) - edge_n
    edge_src = rng.permutation(int(edge_n.sum()))             # a source in one pair only: moves stay a function
    finds = {(int(rng.integers(U)), int(rng.integers(V))) for _ in range(int(rng.integers(0, 4 * V)))}
    pair, tok = (np.array(x, dtype=np.int64) for x in zip(*finds)) if finds else (np.zeros(0, np.int64),) * 2
    nxt = rng.integers(0, 3, len(pair))
    src, t, n = trie.Walked(pair, tok, nxt, edge_src, edge_at, edge_n).moves()
    base = torch.from_numpy(rng.integers(0, 4, V))
    base = torch.unique(base, return_inverse=True)[1]
    out = np.empty(V, dtype=np.int64)
    count, ks, kt, kn = NATIVE.refine_walked(base.numpy(), pair, tok, nxt, edge_src, edge_at, edge_n, out)
    monkeypatch.setattr(classes, "helpers", None)
    want = classes.refine(base, torch.from_numpy(t), torch.from_numpy(src), torch.from_numpy(n))
    assert same_partition(out, want.numpy()) and count == int(out.max()) + 1
    assert count < V or V < 40                                # tokens do share classes (the check has teeth)
    first = set(classes.first_of_each(torch.from_numpy(out)).tolist())
    got = sorted(zip(*(np.frombuffer(x, dtype=np.int64).tolist() for x in (ks, kt, kn))))
    assert got == sorted((a, b, c) for a, b, c in zip(src.tolist(), t.tolist(), n.tolist()) if b in first)
