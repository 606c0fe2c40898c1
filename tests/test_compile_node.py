"""compile_node on hand-built grammar trees against a plain reference: a regular expression.

The reference is written from the node types' documented meaning (grammar/nodes.py), independently of
the automaton builder: each tree becomes a `regex` pattern over bytes (UTF-8 characters spelled out
as RFC 3629's table, JSON escapes spelled out), and a token is legal after a prefix exactly when
prefix + token can still be completed (the `regex` module's partial matching). At every step of
random walks the table's legal set must equal the reference's.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from data_paths import data_dir

from batchmask.compiler import compiled as compiler
from batchmask.compiler.compiled import CompiledGrammar, GrammarCacheError, compile_node
from batchmask.grammar.nodes import Alt, ByteSet, JsonStr, Lit, Repeat, Seq, Str, Word

regex = pytest.importorskip("regex")
LLAMA = data_dir("llama2")

# --- the reference ------------------------------------------------------------------------------
_UTF8_MULTI = (rb"[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}"
               rb"|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}"
               rb"|\xf4[\x80-\x8f][\x80-\xbf]{2}")
_JSON_ESC = rb'\\(?:["\\bfnrt]|u00(?:[01][0-9a-fA-F]|7[fF]))'
_JSON_ASCII = rb"[\x20\x21\x23-\x5b\x5d-\x7e]"


def pattern(node, utf8: bool) -> bytes:
    if isinstance(node, Lit):
        return b"(?:" + regex.escape(node.text) + b")" if node.text else b""
    if isinstance(node, Seq):
        return b"".join(pattern(x, utf8) for x in node.items)
    if isinstance(node, Alt):
        return b"(?:" + b"|".join(pattern(x, utf8) for x in node.options) + b")"
    if isinstance(node, ByteSet):
        on = [b for b in range(256) if node.mask[b]]
        return b"[" + b"".join(b"\\x%02x" % b for b in on) + b"]" if on else b"(?!)"
    if isinstance(node, Repeat):
        return b"(?:" + pattern(node.item, utf8) + b"){%d,%d}" % (node.min, node.max)
    if isinstance(node, JsonStr):
        raw = _JSON_ASCII + b"|" + _UTF8_MULTI if utf8 else rb"[\x20\x21\x23-\x5b\x5d-\x7e\x80-\xff]"
        return b"(?:" + raw + b"|" + _JSON_ESC + b"){%d,%d}" % (node.min, node.max)
    if isinstance(node, Str):
        assert not utf8, "the reference spells the seed's byte-capped UTF-8 values only in the seed oracle"
        return rb"[\x20\x21\x23-\x5b\x5d-\xff]{%d,%d}" % (node.min, node.max)
    if isinstance(node, Word):      # (empty |) one byte of start and end | start, body{min-2..max-2}, end
        s, b, e = (ByteSet(m) for m in (node.start, node.body, node.end))
        one = ByteSet(bytes(x & y for x, y in zip(node.start, node.end)))
        forms = [b""] * (node.min == 0) + [pattern(one, utf8)] * (node.min <= 1 <= node.max)
        if node.max >= 2:
            forms.append(pattern(s, utf8) + pattern(Repeat(b, max(0, node.min - 2), node.max - 2), utf8)
                         + pattern(e, utf8))
        return b"(?:" + b"|".join(forms) + b")"
    raise TypeError(node)


class Reference:
    def __init__(self, node, utf8, token_bytes, stop_ids):
        self.re = regex.compile(pattern(node, utf8), regex.DOTALL)
        self.token_bytes, self.stop_ids = token_bytes, set(stop_ids)
        self.by_first: dict[int, list[int]] = {}
        for i, t in enumerate(token_bytes):
            if t and i not in self.stop_ids:
                self.by_first.setdefault(t[0], []).append(i)

    def viable(self, data: bytes) -> bool:
        return self.re.fullmatch(data, partial=True) is not None

    def complete(self, data: bytes) -> bool:
        return self.re.fullmatch(data) is not None

    def legal(self, prefix: bytes) -> set:
        out = set(self.stop_ids) if self.complete(prefix) else set()
        for b in range(256):
            if b in self.by_first and self.viable(prefix + bytes([b])):
                out |= {i for i in self.by_first[b] if self.viable(prefix + self.token_bytes[i])}
        return out


def walk(g, ref: Reference, rng: random.Random, stay_bias: float, max_steps: int = 300):
    """A random walk; at every step the table's legal set equals the reference's."""
    state, prefix = g.start, b""
    for _ in range(max_steps):
        legal = ref.legal(prefix)
        got = set(torch.nonzero(g.allowed([state])[0]).flatten().tolist())
        assert got == legal, (f"after {prefix!r} (state {state} {g.describe(state)}): table-only "
                              f"{sorted(got - legal)[:6]}, reference-only {sorted(legal - got)[:6]}")
        assert int(g.legal_counts([state])[0]) == len(legal)
        assert bool(g.is_final([state])[0]) == ref.complete(prefix)
        assert legal, f"dead end after {prefix!r}"
        assert ref.complete(prefix + g.finish_bytes(state)), (prefix, g.finish_bytes(state))
        text = sorted(legal - ref.stop_ids)
        if not text or (ref.complete(prefix) and rng.random() < 0.3):
            stop = rng.choice(sorted(ref.stop_ids & legal))
            done = int(g.next_state([state], [stop])[0])
            assert done == g.done_state
            assert g.allowed([done])[0].nonzero().flatten().tolist() == [g.eos_id]
            return prefix
        staying = [t for t in text if b'"' not in ref.token_bytes[t]] if rng.random() < stay_bias else []
        tok = rng.choice(staying or text)
        state = int(g.next_state([state], [tok])[0])
        assert state >= 0
        prefix += ref.token_bytes[tok]
    return prefix


# --- grammars ----------------------------------------------------------------------------------
Q = Lit(b'"')
DIGIT = ByteSet.of(b"0123456789")


def jstr(lo, hi):
    return Seq((Q, JsonStr(lo, hi), Q))


def integer(max_digits):
    return Seq((Alt((Lit(b""), Lit(b"-"))), Alt((Lit(b"0"), Seq((ByteSet.of(b"123456789"),
                                                                  Repeat(DIGIT, 0, max_digits - 1)))))))


def obj(*pairs):
    items = [Lit(b"{")]
    for i, (k, v) in enumerate(pairs):
        items += [Lit((b"," if i else b"") + b'"' + k + b'":'), v]
    return Seq(tuple(items) + (Lit(b"}"),))


GRAMMARS = {
    "tools": Alt((
        obj((b"name", Lit(b'"get"')), (b"arguments", obj((b"city", jstr(1, 12)), (b"days", integer(3))))),
        obj((b"name", Lit(b'"set"')), (b"arguments", obj((b"mode", Alt((Lit(b'"on"'), Lit(b'"off"'), jstr(0, 30))))))),
    )),
    "enum_beside_string": Seq((Lit(b"["), Alt((jstr(0, 6), Lit(b'"red"'), Lit(b'"a\\"b"'), Lit(b"null"))), Lit(b"]"))),
    "two_strings_in_parallel": Alt((Seq((jstr(0, 5), Lit(b"a"))), Seq((jstr(2, 7), Lit(b"b"))))),
    "array": Seq((Lit(b"["), Alt((Lit(b""), Seq((jstr(0, 3), Repeat(Seq((Lit(b","), jstr(1, 2))), 0, 3))))),
                  Lit(b"]"))),
    "optional_and_numbers": Seq((Lit(b"{"), Alt((Seq((Lit(b'"a":'), integer(4), Lit(b","))), Lit(b""))),
                                 Lit(b'"b":'), integer(2), Repeat(Seq((Lit(b"."), DIGIT)), 0, 1), Lit(b"}"))),
    "root_number": integer(5),
    "long_string": Seq((Lit(b'{"text":'), jstr(3, 60), Lit(b"}"))),
}

PIECES = ["é", "€", "😀", "中", "\u0800", "\ud7ff", "\U0010ffff", "\x7f"]


def synthetic_vocab(grammar, seed: int):
    """Ids 0-2 carry no text (2 is eos, 5 another stop id), every single byte, then pieces of
    sample values, escapes and multi-byte characters cut in every way."""
    rng = random.Random(seed)
    text = b"".join(rng.choice([b'{"name":"get","arguments":{"city":"ab\\"c","days":-12}}', b'["red","a\\"b",null]',
                                b'{"a":0,"b":7.5}', b'"\\u001f\\n\\t\\\\x"', b'","', b'"}', b'"]']) for _ in range(30))
    extra = {text[i:i + rng.randint(1, 6)] for i in (rng.randrange(len(text)) for _ in range(150))}
    for p in PIECES:
        raw = p.encode("utf-8", "surrogatepass")
        extra |= {raw, raw[:1], raw[1:], b"a" + raw, raw + b'"', raw[:2], b'\\' + raw[:1]}
    extra |= {b"\\", b"\\u", b"\\u00", b"u007F", b"1f", b'\\"', b'""', b'"a"', b"\xc0\x80", b"\xed\xa0\x80"}
    toks = [b"", b"", b""] + [bytes([b]) for b in range(256)] + sorted(extra - {b""})
    return SimpleNamespace(token_bytes=toks, eos_id=2, stop_ids=(2, 3))


@pytest.mark.parametrize("name", sorted(GRAMMARS))
@pytest.mark.parametrize("utf8", [True, False])
def test_walks_match_the_reference(name, utf8):
    node = GRAMMARS[name]
    vocab = synthetic_vocab(node, seed=len(name))
    g = compile_node(node, vocab, utf8=utf8, key={"test": name})
    ref = Reference(node, utf8, vocab.token_bytes, vocab.stop_ids)
    rng = random.Random(name)
    for stay_bias in (0.0, 0.97, 0.97):      # short values, then values pushed to their caps
        walk(g, ref, rng, stay_bias)


def random_tree(rng: random.Random, depth: int = 3):
    """A random grammar tree over the node types (strings always closed by their quote)."""
    kind = rng.choice(["lit", "str", "set"] if depth == 0 else ["lit", "str", "set", "seq", "alt", "alt", "rep"])
    if kind == "lit":
        return Lit(rng.choice([b"", b"a", b"ab", b'"', b'\\"', b"{", b"1", "é".encode(), b"null", b'"x"']))
    if kind == "str":
        lo = rng.randint(0, 3)
        return jstr(lo, lo + rng.choice([0, 1, 4, 30]))
    if kind == "set":
        return ByteSet.of(rng.sample(b'ab01"\\\xc3', rng.randint(1, 4)))
    if kind == "rep":
        lo = rng.randint(0, 2)
        return Repeat(random_tree(rng, depth - 1), lo, lo + rng.randint(0, 2))
    items = tuple(random_tree(rng, depth - 1) for _ in range(rng.randint(2, 3)))
    return Seq(items) if kind == "seq" else Alt(items)


@pytest.mark.parametrize("seed", range(24))
def test_random_trees_match_the_reference(seed):
    rng = random.Random(seed)
    node = Seq((Lit(b"<"), random_tree(rng, 4), Lit(b">")))
    vocab = synthetic_vocab(node, seed)
    vocab.token_bytes += [b"<", b"<a", b'<"', b">", b'">', b"a>", b'a"', b"1a", b'\\"a']
    g = compile_node(node, vocab, utf8=bool(seed % 2), key={})
    ref = Reference(node, bool(seed % 2), vocab.token_bytes, vocab.stop_ids)
    for stay_bias in (0.0, 0.9):
        walk(g, ref, rng, stay_bias, max_steps=80)


@pytest.fixture(scope="module")
def llama():
    tok = pytest.importorskip("batchmask.models.tokenizer")
    if not (LLAMA / "tokenizer.model").exists():
        pytest.skip("../shared/llama2 not present")
    return tok.load_tokenizer(LLAMA / "tokenizer.model")


@pytest.mark.parametrize("name", ["tools", "long_string", "enum_beside_string"])
def test_llama_walks_match_the_reference(llama, name):
    node = GRAMMARS[name]
    g = compile_node(node, llama, key={"test": name})
    ref = Reference(node, True, llama.token_bytes, (llama.eos_id,))
    rng = random.Random(1)
    for stay_bias in (0.0, 0.97):
        walk(g, ref, rng, stay_bias, max_steps=120)


@pytest.mark.parametrize("name", ["enum_beside_string", "long_string"])
@pytest.mark.parametrize("utf8", [True, False])
def test_inside_escapes_and_characters(name, utf8):
    """Every sub-state of a value (escapes, cut characters), in explicit states and in block cells."""
    node = GRAMMARS[name]
    vocab = synthetic_vocab(node, 0)
    g = compile_node(node, vocab, utf8=utf8, key={})
    ref = Reference(node, utf8, vocab.token_bytes, vocab.stop_ids)
    opening = b"[" if name == "enum_beside_string" else b'{"text":'
    for body in [b"\\", b"\\u", b"\\u0", b"\\u00", b"\\u001", b"\\u007", b"ab\\u00", b"\xe0", b"\xed", b"\xf0",
                 b"\xf4", b"\xf4\x8f", b"\xe2\x82", b"a\xc3", b"abc\\", b"xyz", b'\\"', b"\\t\\u001F"]:
        prefix = opening + b'"' + body
        s = g.start
        for ch in prefix:
            s = int(g.next_state([s], [3 + ch])[0])
            if s < 0:
                break
        if not ref.viable(prefix):
            assert s < 0, prefix
            continue
        assert s >= 0, prefix
        got = set(torch.nonzero(g.allowed([s])[0]).flatten().tolist())
        assert got == ref.legal(prefix), (prefix, g.describe(s))


def test_strings_at_their_cap(llama):
    """A string of exactly max characters closes; one more character is refused, escapes count as one."""
    node = Seq((Lit(b"["), jstr(2, 5), Lit(b"]")))
    g = compile_node(node, llama, key={})
    ids = {t: i for i, t in enumerate(llama.token_bytes)}

    def run(data: bytes):
        s = g.start
        for b in data:
            s = int(g.next_state([s], [ids[bytes([b])] if bytes([b]) in ids else 3 + b])[0])
            if s < 0:
                return None
        return s
    assert run(b'["ab\\"\\u001fc"]') is not None                  # 5 characters, two of them escapes
    assert run(b'["ab\\"\\u001fcd') is None                        # a 6th
    assert run(b'["\xe2\x82\xac\xe2\x82\xac"]') is not None       # multi-byte characters count once
    assert run(b'["a"') is None                                   # under the minimum
    assert run(b'["a\\u0020') is None                            # \\u00XX only for what may not be raw


def test_factored_rows_equal_the_plain_table(llama, monkeypatch):
    node = GRAMMARS["tools"]
    long = Seq((Lit(b"{"), Alt((Seq((Lit(b'"a":'), jstr(0, 300))), Seq((Lit(b'"b":'), jstr(5, 200))))), Lit(b"}")))
    for n in (node, long):
        g = compile_node(n, llama, key={})
        monkeypatch.setattr(compiler, "_far_mask", lambda blk, depth, dev: compiler.far_mask(blk, None, dev))
        plain = compile_node(n, llama, key={})
        monkeypatch.undo()
        assert torch.equal(g.class_next, plain.class_next) and torch.equal(g.legal_count, plain.legal_count)
    assert g.num_rows * 20 < g.num_states             # the long values' cells share rows by shift


def test_table_size_does_not_grow_with_max_length(llama):
    small = compile_node(Seq((Lit(b'{"t":'), jstr(0, 40), Lit(b"}"))), llama, key={})
    big = compile_node(Seq((Lit(b'{"t":'), jstr(0, 4000), Lit(b"}"))), llama, key={})
    assert big.num_rows == small.num_rows and big.num_classes == small.num_classes
    assert big.num_states > 32767 and big.row_next.dtype == big.state_row.dtype == torch.int16   # codes stay small
    grown = 2 * (big.num_states - small.num_states) + 4 * (big.targets.numel() - small.targets.numel())
    assert big.nbytes - small.nbytes == grown                  # state_row (int16) and the target list only


def test_stop_ids_and_empty_tokens():
    node = GRAMMARS["optional_and_numbers"]
    vocab = synthetic_vocab(node, 0)
    vocab.token_bytes[1] = b""       # a special: never legal
    g = compile_node(node, vocab, key={})
    assert g.stop_ids == (2, 3)
    s = g.start
    for ch in b'{"b":7}':
        s = int(g.next_state([s], [3 + ch])[0])
    assert set(g.allowed([s])[0].nonzero().flatten().tolist()) == {2, 3}
    for stop in (2, 3):
        done = int(g.next_state([s], [stop])[0])
        assert done == g.done_state and g.allowed([done])[0].nonzero().flatten().tolist() == [2]
    assert not bool(g.allowed(torch.arange(g.num_states))[:, :2].any())


def test_cache_round_trip(tmp_path, llama):
    node = GRAMMARS["tools"]
    g = compile_node(node, llama, key={"grammar": "test", "n": 1})
    path = tmp_path / "g.pt"
    g.save(path)
    for g2 in (CompiledGrammar.load(path, key={"grammar": "test", "n": 1}, tokenizer=llama),
               CompiledGrammar.load(path)):
        assert torch.equal(g2.class_next, g.class_next) and torch.equal(g2.token_class, g.token_class)
        s = list(range(0, g.num_states, 7))
        assert [g2.finish_bytes(x) for x in s] == [g.finish_bytes(x) for x in s]
        assert [g2.describe(x) for x in s] == [g.describe(x) for x in s]
    with pytest.raises(GrammarCacheError, match="another n: file has 1, expected 2"):
        CompiledGrammar.load(path, key={"grammar": "test", "n": 2}, tokenizer=llama)
    with pytest.raises(GrammarCacheError, match="stop_ids"):
        CompiledGrammar.load(path, key={"grammar": "test", "n": 1},
                             tokenizer=SimpleNamespace(token_bytes=llama.token_bytes, eos_id=llama.eos_id,
                                                       stop_ids=(llama.eos_id, 0), vocab_hash=llama.vocab_hash))


def test_bad_trees_are_refused(llama):
    with pytest.raises(ValueError, match=r"grammar\.items\[1\]: not a grammar node: str"):
        compile_node(Seq((Lit(b"a"), "b")), llama, key={})
    with pytest.raises(ValueError, match="closing quote"):
        compile_node(Seq((Lit(b'"'), JsonStr(0, 3))), llama, key={})
    with pytest.raises(ValueError, match="min <= max"):
        compile_node(Repeat(Lit(b"a"), 3, 1), llama, key={})
    with pytest.raises(ValueError, match="two different strings stay open side by side"):
        compile_node(Alt((Seq((jstr(0, 3000), Lit(b"a"))), Seq((jstr(1, 2000), Lit(b"b"))))), llama, key={})
    with pytest.raises(ValueError, match="JSON-able"):
        compile_node(Lit(b"a"), llama, key={"x": object()})
