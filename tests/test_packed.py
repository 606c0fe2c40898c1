"""Packed rows (batchmask/table/packed.py): the placement keeps every entry and invents none, and a grammar compiled
packed is the grammar compiled dense everywhere it is read: CompiledGrammar's queries, the masker's masks,
advances and tokens on every backend (Triton under TRITON_INTERPRET=1 without a GPU), the cache file, combine and
forced tokens."""
import json
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
from batchmask.models.tokenizer import load_tokenizer
from data_paths import CATALOGUE, data_dir, qwen2_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchmask import compile_grammar, compile_json_schema
from batchmask.compiler.compiled import CompiledGrammar
from batchmask.compiler.sets import combine
from batchmask.masker import BatchMasker
from batchmask.table import packed
from batchmask.table.packed import (
    _claimed_twice,
    block_shift,
    codes_at,
    column_sets,
    owned_slots,
    pack,
    place_rows,
    row_codes,
    want_packed,
)
from batchmask.table.write import RowParts
from batchmask.tools.registry import ToolRegistry
from tests.kernel_helpers import DEVICE, HAVE_TRITON

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                      "kind": {"enum": ["alpha", "beta", "gamma delta"]},
                                      "sizes": {"type": "array", "items": {"type": "integer", "minimum": -5,
                                                                           "maximum": 300}, "maxItems": 3}},
     "required": ["name", "kind"]},
    {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                                              "ok": {"type": "boolean"}}}, "maxItems": 2},
]


@pytest.fixture(scope="module")
def vocabs():
    return {"llama2": load_tokenizer(str(data_dir("llama2") / "tokenizer.model")),
            "gpt2": load_tokenizer(str(data_dir("gpt2") / "tokenizer.json"))}


def grammars(tok):
    """(name, compile function taking pack=) of the grammars compared, on one tokenizer."""
    catalogue = ToolRegistry.from_obj(json.loads(CATALOGUE.read_text()))
    out = [("seed", lambda pack: compile_grammar(ToolRegistry.defaults(), tok, max_string=8, pack=pack)),
           ("catalogue", lambda pack: compile_grammar(catalogue, tok, format="json", max_string=8, pack=pack))]
    return out + [(f"schema{i}", lambda pack, s=s: compile_json_schema(s, tok, pack=pack))
                  for i, s in enumerate(SCHEMAS)]


# ----------------------------------------------------------------------------------------------------------
# the layout on its own

def read_all(p, R, C) -> torch.Tensor:
    """int64 [R, C]: every (row, class) read through the one rule, pointwise."""
    t = type("T", (), {})()
    t.row_next, t.row_base, t.row_check, t.num_classes = p.codes, p.base, p.check, C
    rows = torch.arange(R)[:, None].expand(R, C).contiguous()
    cols = torch.arange(C)[None, :].expand(R, C).contiguous()
    return codes_at(t, rows, cols).long()


def check_layout(p, dense: torch.Tensor) -> None:
    """Every legal entry reads its code, every other reads -1 (pointwise and by rows); bases distinct; padded."""
    R, C = dense.shape
    assert torch.equal(read_all(p, R, C), dense.long())
    t = type("T", (), {})()
    t.row_next, t.row_base, t.row_check, t.num_classes = p.codes, p.base, p.check, C
    assert torch.equal(row_codes(t, torch.arange(R)).long(), dense.long())
    assert p.base.unique().numel() == R and (R == 0 or int(p.base.min()) >= 0)
    assert R == 0 or int(p.base.max()) + C <= p.codes.numel() == p.check.numel()
    assert p.check.dtype == torch.int16 and p.base.dtype == torch.int32


@st.composite
def sparse_tables(draw):
    R, C = draw(st.integers(1, 40)), draw(st.integers(1, 90))
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    fill = draw(st.sampled_from([0.0, 0.02, 0.1, 0.5, 1.0]))
    legal = torch.rand(R, C, generator=g) < fill
    legal[torch.randint(0, R, (R // 3,), generator=g)] = torch.rand(C, generator=g) < 0.9   # a few dense rows
    codes = torch.randint(-300, 300, (R, C), generator=g)
    codes[codes == -1] = 0
    return torch.where(legal, codes, -1).to(torch.int16)


PLACEMENTS = [pytest.param("first fit", marks=pytest.mark.skipif(packed.helpers is None,
                                                                  reason="table/native_c/ is not built")),
              "random rounds"]


@pytest.fixture
def placement(request, monkeypatch):
    """place_rows's rows of at most SMALL_ROW entries by the compiled first fit, or by the numpy random rounds."""
    if request.param == "random rounds":
        monkeypatch.setattr(packed, "helpers", None)
    return request.param


@pytest.mark.parametrize("placement", PLACEMENTS, indirect=True)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sparse_tables())
def test_placement_reads_back_every_entry_and_nothing_else(placement, dense):
    p = pack(*torch.nonzero(dense != -1, as_tuple=True), dense[dense != -1].long(), *dense.shape, dense.dtype)
    check_layout(p, dense)
    R, C = dense.shape
    assert p.codes.numel() == int(p.base.max()) + C      # padded to exactly the last row's columns
    slot, row, col = owned_slots(p.base, p.check)
    assert torch.equal(dense[row, col].long(), p.codes[slot].long()) and len(slot) == int((dense != -1).sum())


def test_a_wrong_layout_is_caught():
    """The companion: two rows given one base (the rule then reads a row's entry in the other) fail the check."""
    dense = torch.full((3, 8), -1, dtype=torch.int16)
    dense[0, 1], dense[1, 2], dense[2, 5] = 7, 8, 9
    p = pack(*torch.nonzero(dense != -1, as_tuple=True), dense[dense != -1].long(), 3, 8, dense.dtype)
    check_layout(p, dense)
    bad = p.base.clone()
    bad[1] = bad[0]
    wrong = p._replace(base=bad, codes=p.codes.clone(), check=p.check.clone())
    at = int(bad[1]) + 2
    wrong.codes[at], wrong.check[at] = 8, 2              # row 1's entry written where its new base puts it
    with pytest.raises(AssertionError):
        check_layout(wrong, dense)


@pytest.mark.parametrize("placement", PLACEMENTS, indirect=True)
def test_placement_is_compact_on_a_realistic_sparse_table(placement):
    """Rows like a large schema's (mostly <= 4 legal classes, some tens, a few near-dense) pack to a few times
    their legal entries plus a row of padding: by the random rounds 6.7x here, where columns are uniformly random
    (rows of tens of random columns collide at almost every shift), by first fit 2.3x; JSONSchemaBench's largest
    tables pack to 2.9-4.0x by the random rounds."""
    rng = np.random.default_rng(0)
    R, C = 3000, 600
    n = np.concatenate([rng.integers(0, 5, 2300), rng.integers(5, 45, 680), rng.integers(100, 550, 20)])
    row = np.repeat(np.arange(R), n)
    col = np.concatenate([rng.choice(C, size=k, replace=False) for k in n])
    base = place_rows(row, col, R, C)
    assert len(np.unique(base)) == R and len(np.unique(base[row] + col)) == len(row)
    assert base.max() + C <= (3 if placement == "first fit" else 8) * len(row) + C


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 80), min_size=1, max_size=60), st.integers(1, 12))
def test_block_shift_is_the_least_shift_that_keeps_a_block_disjoint(cols, k):
    """Against a brute force over shifts with Python sets: k copies of S at multiples of d never share a slot, and
    no smaller d does that."""
    S = sorted(cols)
    d = block_shift(np.array(S), k, 81)

    def disjoint(d):
        slots = [b * d + c for b in range(k) for c in S]
        return len(set(slots)) == len(slots)
    if k == 1:
        assert d == 0
        return
    assert disjoint(d)
    assert not any(disjoint(e) for e in range(1, d))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.frozensets(st.integers(0, 40), min_size=1, max_size=20), min_size=1, max_size=30))
def test_column_sets_groups_rows_by_their_column_sets(rows):
    """Ids equal exactly where the rows' sets are equal (Python's frozenset equality is the reference)."""
    n = np.array([len(r) for r in rows])
    col = np.concatenate([sorted(r) for r in rows]).astype(np.int64)
    ids = column_sets(col, np.cumsum(n) - n, n, np.arange(len(rows)))
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (ids[i] == ids[j]) == (rows[i] == rows[j])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-3, 12), max_size=40))
def test_claimed_twice_marks_the_values_that_repeat(xs):
    """The placement's round finds clashing claims by sorting them: each entry is marked iff its value occurs again
    (collections.Counter is the reference)."""
    from collections import Counter
    count = Counter(xs)
    got = _claimed_twice(np.array(xs, dtype=np.int64))
    assert got.tolist() == [count[x] > 1 for x in xs]


def test_when_to_pack():
    assert not want_packed(None, 100, 100, torch.int16)                  # small: dense
    assert want_packed(None, 50_000, 2_000, torch.int32)                 # 400 MB: packed
    assert not want_packed(None, 50_000, 2_000, torch.int32, legal=40_000_000)   # large but not sparse
    # a 2.7x gain: packed above PACK_LARGE_BYTES (40 MB dense here), dense below it (10 MB)
    assert want_packed(None, 10_000, 2_000, torch.int16, legal=2_500_000)
    assert not want_packed(None, 2_500, 2_000, torch.int16, legal=625_000)
    assert want_packed(True, 3, 3, torch.int16) and not want_packed(False, 50_000, 2_000, torch.int32)
    with pytest.raises(ValueError, match="int16"):
        want_packed(True, 3, 40_000, torch.int16)


# ----------------------------------------------------------------------------------------------------------
# compiled grammars: packed == dense

def assert_same_grammar(d: CompiledGrammar, p: CompiledGrammar) -> None:
    """Equal tables (every row written out through the rule, and the decoded class_next where it is small), and
    equal queries on up to 400 states (the catalogue on GPT-2 has 129K states: [S, V] would be 6 GB)."""
    assert p.packed and not d.packed
    assert torch.equal(d.state_row, p.state_row) and torch.equal(d.token_class, p.token_class)
    assert (p.num_rows, p.num_classes) == (d.num_rows, d.num_classes)
    assert torch.equal(row_codes(p, torch.arange(p.num_rows)), d.row_next)
    if d.num_states <= 20_000:
        assert torch.equal(d.class_next, p.class_next)
    states = torch.unique(torch.cat([torch.linspace(0, d.num_states - 1, 400).long(), torch.tensor([d.start])]))
    assert torch.equal(d.allowed(states), p.allowed(states))
    tokens = torch.randint(-3, d.vocab_size + 3, (len(states), 64), generator=torch.Generator().manual_seed(1))
    assert torch.equal(d.next_state(states[:, None], tokens), p.next_state(states[:, None], tokens))
    assert torch.equal(d.next_state(states, tokens[:, 0]), p.next_state(states, tokens[:, 0]))
    assert torch.equal(d.legal_counts(states), p.legal_counts(states)) and torch.equal(d.final, p.final)


def run_masker(g, backend, states, steps=10):
    """Masks, legal counts, greedy / sampled tokens and states of a masker walking from `states`."""
    m = BatchMasker(g, len(states), device=DEVICE, backend=backend)
    m.rows.state.copy_(torch.tensor(states, dtype=torch.int32))
    gen = torch.Generator().manual_seed(5)
    out = []
    for i in range(steps):
        logits = torch.randn(len(states), g.vocab_size + 7, generator=gen).to(DEVICE)
        masked = logits.clone()
        counts = m.apply_(masked)
        out += [masked.cpu(), counts.cpu()]
        tokens = m.sample(logits, temperature=0.0 if i % 2 else 0.8, seed=11)
        out += [tokens.cpu(), m.states.cpu().clone()]
    return out


def backends():
    return ["torch", "triton"] if HAVE_TRITON else ["torch"]


@pytest.mark.parametrize("vocab", ["llama2", "gpt2"])
def test_packed_grammars_equal_dense(vocabs, vocab):
    tok = vocabs[vocab]
    for name, build in grammars(tok):
        d, p = build(False), build(True)
        assert_same_grammar(d, p)
        assert p.nbytes == sum(x.numel() * x.element_size() for x in (
            p.token_class, p.state_row, p.row_next, p.row_base, p.row_check, p.row_legal, p.row_final, p.targets,
            p.segment_start, p.segment_base))
        rng = np.random.default_rng(len(name))
        states = [d.start, d.done_state] + rng.integers(0, d.num_states - 1, 6).tolist()
        for backend in backends() if (vocab, name) == ("llama2", "schema0") else ["torch"]:   # the interpreter is slow
            for a, b in zip(run_masker(d, backend, states), run_masker(p, backend, states)):
                assert torch.equal(a, b), (vocab, name, backend)


def test_auto_keeps_small_tables_dense(vocabs):
    g = compile_json_schema(SCHEMAS[0], vocabs["llama2"])
    assert not g.packed and g.row_next.dim() == 2


def test_cache_round_trip_of_a_packed_grammar(vocabs, tmp_path):
    tok = vocabs["llama2"]
    p = compile_json_schema(SCHEMAS[0], tok, pack=True)
    p.save(tmp_path / "g.pt")
    q = CompiledGrammar.load(tmp_path / "g.pt", tokenizer=tok, key=p.meta["key"])
    assert q.packed and q.num_classes == p.num_classes
    for k in ("row_next", "row_base", "row_check", "state_row", "token_class", "targets"):
        assert torch.equal(getattr(q, k), getattr(p, k)), k
    assert torch.equal(q.class_next, p.class_next)
    d = compile_json_schema(SCHEMAS[0], tok, pack=False)          # a dense file still loads dense
    d.save(tmp_path / "d.pt")
    assert not CompiledGrammar.load(tmp_path / "d.pt", tokenizer=tok, key=d.meta["key"]).packed


def test_combine_a_packed_and_a_dense_grammar(vocabs):
    tok = vocabs["llama2"]
    a_d, a_p = (compile_json_schema(SCHEMAS[0], tok, pack=x) for x in (False, True))
    b = compile_json_schema(SCHEMAS[1], tok, pack=False)
    dense, mixed = combine([a_d, b]), combine([a_p, b])
    assert mixed.packed and not dense.packed
    assert torch.equal(dense.class_next, mixed.class_next) and mixed.starts == dense.starts
    states = [dense.starts[0], dense.starts[1], dense.done_state, 3, dense.num_states - 2]
    for x, y in zip(run_masker(dense, "torch", states), run_masker(mixed, "torch", states)):
        assert torch.equal(x, y)


def test_forced_tokens_equal(vocabs):
    tok = vocabs["llama2"]
    d, p = (compile_json_schema(SCHEMAS[0], tok, pack=x) for x in (False, True))
    fd, fp = d.forced_tokens(tok), p.forced_tokens(tok)
    for k in fd.__dataclass_fields__:
        a, b = getattr(fd, k), getattr(fp, k)
        assert (torch.equal(a, b) if torch.is_tensor(a) else np.array_equal(a, b) if isinstance(a, np.ndarray)
                else a == b), k


# ----------------------------------------------------------------------------------------------------------
# auto: the decision on the counted entries

def _counting_entries(monkeypatch) -> list:
    """RowParts._entries wrapped: the counts it returns, in order."""
    seen, entries = [], RowParts._entries

    def counted(self, *args):
        seen.append(entries(self, *args))
        return seen[-1]
    monkeypatch.setattr(RowParts, "_entries", counted)
    return seen


@pytest.mark.parametrize("vocab", ["llama2", "gpt2"])
def test_entries_counted_on_the_parts_are_the_written_tables(vocabs, vocab, monkeypatch):
    """The legal entries counted on the parts (what auto decides on) are the dense table's legal cells and the
    packed table's owned slots, on every grammar."""
    seen = _counting_entries(monkeypatch)
    for name, build in grammars(vocabs[vocab]):
        d, p = build(False), build(True)
        assert len(seen) == 1, name                     # forced packed counts once; forced dense never
        assert seen.pop() == int((d.row_next != -1).sum()) == int((p.row_check != -1).sum()), name


def test_auto_writes_a_table_that_would_not_gain_dense_without_listing_its_entries(monkeypatch):
    """Qwen2's catalogue table is 5.6 MB dense (past PACK_MIN_BYTES) and ~40% legal: auto counts its entries,
    writes it dense straight away (never the list of a million triples), and it is the table pack=False writes."""
    tok = load_tokenizer(str(qwen2_dir() / "tokenizer.json"))
    reg = ToolRegistry.from_obj(json.loads(CATALOGUE.read_text()))
    dense = compile_grammar(reg, tok, format="json", pack=False)
    seen = _counting_entries(monkeypatch)

    def never(*args, **kwargs):
        raise AssertionError("the entries were listed for a table that stays dense")
    monkeypatch.setattr(RowParts, "_packed", never)
    auto = compile_grammar(reg, tok, format="json")
    assert want_packed(None, dense.num_rows, dense.num_classes, dense.row_next.dtype)      # the shape alone: pack
    assert seen == [int((dense.row_next != -1).sum())] and not auto.packed
    for f in ("token_class", "state_row", "row_next", "row_legal", "row_final", "targets"):
        assert torch.equal(getattr(auto, f), getattr(dense, f)), f
