"""The compiled token table against the plain per-sequence oracle (tests/seed_oracle.py)."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from data_paths import data_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from seed_oracle import Oracle

from batchmask.compiler.compiled import CompiledGrammar, GrammarCacheError, compile_grammar
from batchmask.tools.registry import Tool, ToolArg, ToolRegistry

LLAMA = data_dir("llama2")


def oracle_for(registry, max_string, utf8):
    return Oracle([(t.name, [a.name for a in t.required_args]) for t in registry], max_string, utf8)


def walk_and_compare(g, oracle, token_bytes, eos_id, rng, stay_bias, max_steps=400):
    """Random walk under the oracle; at every step the table must agree with it exactly."""
    o_state, g_state = oracle.start(), g.start
    quote_free = [i for i, t in enumerate(token_bytes) if t and b'"' not in t]
    for _ in range(max_steps):
        legal = oracle.legal(o_state, token_bytes, eos_id)
        allowed = set(torch.nonzero(g.allowed([g_state])[0]).flatten().tolist())
        assert allowed == legal, (f"state {g_state} {g.describe(g_state)}: table-only "
                                  f"{sorted(allowed - legal)[:8]}, oracle-only {sorted(legal - allowed)[:8]}")
        assert int(g.legal_counts([g_state])[0]) == len(legal)
        assert bool(g.is_final([g_state])[0]) == oracle.is_done(o_state)
        assert g.describe(g_state) == oracle.describe(o_state)
        assert g.finish_bytes(g_state) == oracle.finish(o_state)
        assert legal, f"reachable state {g_state} has no legal token"
        if oracle.is_done(o_state):
            assert legal == {eos_id}
            done = int(g.next_state([g_state], [eos_id])[0])
            assert done == g.done_state and g.allowed([done])[0].nonzero().flatten().tolist() == [eos_id]
            return
        staying = [t for t in legal if t in quote_free] if rng.random() < stay_bias else []
        tok = rng.choice(sorted(staying or legal))
        nxt = int(g.next_state([g_state], [tok])[0])
        assert nxt >= 0
        o_state = oracle.consume(o_state, token_bytes[tok])
        g_state = nxt
    raise AssertionError("walk did not finish")


# --- strategies ---------------------------------------------------------------------------
names = st.text(alphabet="ab_c", min_size=1, max_size=4)
arg_names = st.text(alphabet="xyk", min_size=1, max_size=3)


@st.composite
def registries(draw):
    tool_names = draw(st.lists(names, min_size=1, max_size=8, unique=True))
    tools = []
    for n in tool_names:
        args = draw(st.lists(arg_names, min_size=0, max_size=3, unique=True))
        tools.append(Tool(n, "a tool", tuple(ToolArg(a) for a in args)))
    return ToolRegistry(tools)


PIECES = ["é", "€", "😀", "中", "\u0800", "\ud7ff", "\U0010ffff"]


@st.composite
def vocabularies(draw, registry):
    """Ids 0-2 carry no text, then every single byte (byte fallback), then tricky tokens."""
    calls = []
    for t in registry:
        value = draw(st.text(alphabet='ab "\\é€😀{}:,', min_size=1, max_size=5))
        calls.append('{"tool":"%s","args":{%s}}' % (t.name, ",".join(
            '"%s":"%s"' % (a.name, value) for a in t.required_args)))
    text = "".join(calls).encode()
    extra = set()
    for _ in range(draw(st.integers(20, 120))):
        i = draw(st.integers(0, len(text) - 1))
        extra.add(text[i:i + draw(st.integers(1, 8))])
    extra |= {b'{"', b'":"', b'","', b'"}}', b'"}', b'a"', b'"a', b'x":"', b"\x01a", b"\x7f", b"a\\"}
    for p in PIECES:
        raw = p.encode("utf-8", "surrogatepass")
        extra |= {raw, raw[:1], raw[1:], b"a" + raw, raw + b'"', raw[:2]}
    extra |= {bytes([b]) * 2 for b in (0xC0, 0xC2, 0xED, 0xF4, 0xF5)}
    toks = [b"", b"", b""] + [bytes([b]) for b in range(256)] + sorted(extra - {b""})
    return SimpleNamespace(token_bytes=toks, eos_id=2)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_table_matches_oracle_on_random_grammars(data):
    registry = data.draw(registries())
    vocab = data.draw(vocabularies(registry))
    max_string = data.draw(st.sampled_from([1, 2, 3, 5, 8, 12, 24, 40]))   # 24+: shared 'far' rows
    utf8 = data.draw(st.booleans())
    g = compile_grammar(registry, vocab, max_string=max_string, utf8=utf8)
    oracle = oracle_for(registry, max_string, utf8)
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    for stay_bias in (0.0, 0.95):     # short values, then values pushed up to the cap
        walk_and_compare(g, oracle, vocab.token_bytes, vocab.eos_id, rng, stay_bias)


def test_every_token_reachable_state_has_a_legal_token_even_with_missing_bytes():
    """A vocabulary without single bytes could strand a row; the compiler cuts such paths."""
    registry = ToolRegistry([Tool("calc", "", (ToolArg("expr"),))])
    toks = [b"", b"", b"", b'{"tool":"', b"answer", b"calc", b'","args":{"', b'text":"', b'expr":"',
            b"abc", b"ab", b'"}}', b"\xc3", b"\xa9"]
    g = compile_grammar(registry, SimpleNamespace(token_bytes=toks, eos_id=2), max_string=4)
    seen, frontier = {g.start}, [g.start]
    while frontier:
        s = frontier.pop()
        allowed = torch.nonzero(g.allowed([s])[0]).flatten()
        assert len(allowed) > 0, f"state {s} {g.describe(s)} is a dead end"
        for t in allowed.tolist():
            n = int(g.next_state([s], [t])[0])
            if n not in seen:
                seen.add(n)
                frontier.append(n)
    assert g.done_state in seen


def test_bad_max_string_is_refused():
    vocab = SimpleNamespace(token_bytes=[b"", b"", b""] + [bytes([b]) for b in range(256)], eos_id=2)
    with pytest.raises(ValueError, match="max_string"):
        compile_grammar(ToolRegistry.defaults(), vocab, max_string=0)


# --- the real Llama 2 vocabulary ------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_vocab():
    tok = pytest.importorskip("batchmask.models.tokenizer")
    if not (LLAMA / "tokenizer.model").exists():
        pytest.skip("../shared/llama2 not present")
    return tok.load_tokenizer(LLAMA / "tokenizer.model")


@pytest.fixture(scope="module")
def llama_grammar(llama_vocab):
    return compile_grammar(ToolRegistry.defaults(), llama_vocab)


def test_start_state_allows_exactly_the_prefixes_of_the_opening(llama_vocab, llama_grammar):
    opening = b'{"tool":"'
    want = {i for i, t in enumerate(llama_vocab.token_bytes) if t and opening.startswith(t)}
    got = set(torch.nonzero(llama_grammar.allowed([llama_grammar.start])[0]).flatten().tolist())
    assert got == want and len(want) >= 2


@pytest.mark.parametrize("utf8,max_string,seed", [(True, 256, 0), (True, 20, 1), (False, 20, 2)])
def test_llama_vocabulary_walks_match_oracle(llama_vocab, utf8, max_string, seed):
    g = compile_grammar(ToolRegistry.defaults(), llama_vocab, max_string=max_string, utf8=utf8)
    oracle = oracle_for(ToolRegistry.defaults(), max_string, utf8)
    rng = random.Random(seed)
    walk_and_compare(g, oracle, llama_vocab.token_bytes, llama_vocab.eos_id, rng,
                     stay_bias=0.9 if max_string < 100 else 0.0)


def test_llama_grammar_sizes(llama_grammar):
    g = llama_grammar
    assert g.vocab_size == 32000
    assert g.num_classes < 1000                     # token classes really factor the table
    assert g.num_rows < g.num_states // 4           # and value states share rows
    assert g.nbytes < 2 * 2**20


def test_factored_rows_equal_the_plain_table(llama_vocab):
    """Rows computed for representatives only decode to exactly the rows computed state by state."""
    from batchmask.compiler import compiled as compiler
    g = compile_grammar(ToolRegistry.defaults(), llama_vocab, max_string=300)
    real = compiler._far_mask
    try:
        compiler._far_mask = lambda blk, depth, dev: real(blk, None, dev)     # every state its own row
        plain = compile_grammar(ToolRegistry.defaults(), llama_vocab, max_string=300)
    finally:
        compiler._far_mask = real
    assert torch.equal(g.class_next, plain.class_next)
    assert torch.equal(g.legal_count, plain.legal_count)


def test_cache_round_trip_and_refusals(tmp_path, llama_vocab, llama_grammar):
    path = tmp_path / "g.pt"
    llama_grammar.save(path)
    reg = ToolRegistry.defaults()
    g2 = CompiledGrammar.load(path, registry=reg, tokenizer=llama_vocab)
    assert torch.equal(g2.class_next, llama_grammar.class_next)
    assert torch.equal(g2.token_class, llama_grammar.token_class)
    s = torch.arange(0, g2.num_states, 97)
    assert torch.equal(g2.allowed(s), llama_grammar.allowed(s))
    assert [g2.finish_bytes(int(x)) for x in s] == [llama_grammar.finish_bytes(int(x)) for x in s]
    # on its own: the registry and the vocabulary recorded in the file
    g3 = CompiledGrammar.load(path, "cpu")
    assert torch.equal(g3.row_next, llama_grammar.row_next) and g3.token_bytes == llama_grammar.token_bytes
    assert g3.finish_bytes(int(s[3])) == llama_grammar.finish_bytes(int(s[3]))
    # another registry
    other = ToolRegistry([Tool("calc", "", (ToolArg("expr"),))])
    with pytest.raises(GrammarCacheError, match="registry"):
        CompiledGrammar.load(path, registry=other, tokenizer=llama_vocab)
    # another vocabulary
    tb = list(llama_vocab.token_bytes)
    tb[500] = b"changed"
    with pytest.raises(GrammarCacheError, match="vocab"):
        CompiledGrammar.load(path, registry=reg, tokenizer=SimpleNamespace(token_bytes=tb, eos_id=2))
    # other options
    with pytest.raises(GrammarCacheError, match="max_string"):
        CompiledGrammar.load(path, registry=reg, tokenizer=llama_vocab, max_string=64)
    # corrupt files
    bad = tmp_path / "bad.pt"
    bad.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(GrammarCacheError, match="bad.pt"):
        CompiledGrammar.load(bad, registry=reg, tokenizer=llama_vocab)
    with pytest.raises(GrammarCacheError, match="not found"):
        CompiledGrammar.load(tmp_path / "missing.pt", registry=reg, tokenizer=llama_vocab)
    # target segments that do not rise from 0, that read past the list, or are missing: one line each
    payload = torch.load(path, weights_only=True)
    T = payload["targets"].numel()
    G = payload["segment_start"].numel()
    assert G > 1                                               # its value blocks have segments of their own
    for field, value in [("segment_start", payload["segment_start"].flip(0)),
                         ("segment_base", torch.full((G,), T + 1, dtype=torch.int32)), ("segment_base", None)]:
        broken = dict(payload)
        if value is None:
            broken.pop(field)
        else:
            broken[field] = value
        torch.save(broken, bad)
        with pytest.raises(GrammarCacheError, match="bad.pt: corrupt grammar cache"):
            CompiledGrammar.load(bad, registry=reg, tokenizer=llama_vocab)
