"""Word (grammar/nodes.py): a run of ASCII bytes (first from `start`, the others from `body`, the last from `end`)
compiled as a value block. Checked token by token against
a regex of the same language (test_compile_node's Reference), on a synthetic vocabulary of every byte and pieces
of words, and on Llama 2's."""
from __future__ import annotations

import random

import pytest
import torch
from test_compile_node import Reference, llama, walk  # noqa: F401  (fixture)

from batchmask.compiler.compiled import compile_node
from batchmask.grammar.nodes import Alt, ByteSet, Lit, Repeat, Seq, Word

ALNUM = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def mask(chars: bytes) -> bytes:
    return ByteSet.of(chars).mask


LABEL = Word(mask(ALNUM), mask(ALNUM + b"-"), mask(ALNUM), 1, 12)
TLD = Word(mask(ALNUM[:52]), mask(ALNUM + b"-"), mask(ALNUM), 2, 9)
GRAMMARS = {
    "host": Seq((Lit(b'"'), Repeat(Seq((LABEL, Lit(b"."))), 1, 3), TLD, Lit(b'"'))),
    "digits": Seq((Lit(b"["), Word(mask(b"0123456789"), mask(b"0123456789"), mask(b"0123456789"), 0, 40), Lit(b"]"))),
    "atoms": Seq((Lit(b"<"), Word(mask(ALNUM + b"!#$%&'*+/=?^_`{|}~-"), mask(ALNUM + b"!#$%&'*+/=?^_`{|}~-"),
                                  mask(ALNUM + b"!#$%&'*+/=?^_`{|}~-"), 1, 10),
                  Repeat(Seq((Lit(b"."), Word(mask(ALNUM), mask(ALNUM), mask(ALNUM), 1, 10))), 0, 2), Lit(b">"))),
    "either": Seq((Lit(b"("), Word(mask(b"abc-"), mask(b"abc-"), mask(b"abc"), 0, 30), Alt((Lit(b")"), Lit(b";x)"))))),
}


def pieces_vocab(seed: int):
    rng = random.Random(seed)
    text = b'"ab-c9.x-y.example.org" [0123456789012] <a!b.c#d.efgh> (abc-abc;x) "' + ALNUM + b'-.'
    extra = {text[i:i + rng.randint(1, 7)] for i in (rng.randrange(len(text)) for _ in range(400))}
    from types import SimpleNamespace
    toks = [b"", b"", b""] + [bytes([b]) for b in range(256)] + sorted(extra - {b""})
    return SimpleNamespace(token_bytes=toks, eos_id=2, stop_ids=(2,))


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_words_match_the_reference(name, llama):  # noqa: F811
    node = GRAMMARS[name]
    for vocab in (pieces_vocab(len(name)), llama):
        g = compile_node(node, vocab, key={"test": name})
        assert g.automaton.blocks, "the words are value blocks"
        ref = Reference(node, True, vocab.token_bytes, tuple(getattr(vocab, "stop_ids", (vocab.eos_id,))))
        rng = random.Random(name)
        for stay_bias in (0.0, 0.9, 0.97, 0.97):
            walk(g, ref, rng, stay_bias, max_steps=120)


def test_an_ambiguous_end_and_bad_masks_are_refused(llama):  # noqa: F811
    with pytest.raises(ValueError, match="a Word must be followed by bytes it cannot hold"):
        compile_node(Seq((Lit(b"("), Word(mask(b"ab"), mask(b"ab"), mask(b"ab"), 1, 9), Lit(b"a)"))), llama, key={})
    with pytest.raises(ValueError, match="end within body"):
        compile_node(Seq((Word(mask(b"ab"), mask(b"a"), mask(b"b"), 1, 9), Lit(b")"))), llama, key={})
    with pytest.raises(ValueError, match="ASCII only"):
        compile_node(Seq((Word(mask(b"\xc3"), mask(b"\xc3"), mask(b"\xc3"), 1, 9), Lit(b")"))), llama, key={})


def test_a_word_grammar_round_trips_through_its_cache_file(llama, tmp_path):  # noqa: F811
    g = compile_node(GRAMMARS["host"], llama, key={"t": 1})
    g.save(tmp_path / "g.pt")
    again = type(g).load(tmp_path / "g.pt", tokenizer=llama, key={"t": 1})
    assert torch.equal(again.row_next, g.row_next) and again.finish_bytes(again.start) == g.finish_bytes(g.start)


def test_hostnames_are_the_documented_language():
    """schema_formats_net._host writes hostnames so that a label's first byte says whether it may be the last
    (no two labels side by side in the automaton); the language must stay the documented one: min..4 labels
    of letters, digits and inner hyphens, the last starting with a letter (checked against that definition as
    a regex, on strings near both)."""
    import re
    import string

    from schema_reference import compile_regex

    from batchmask.schema import formats_net as net
    rng = random.Random(5)
    letters = string.ascii_letters                              # the definition's own alphabet
    alnum = letters + string.digits
    for budget, min_labels in ((60, 1), (60, 2), (20, 1), (12, 2)):
        node, lo, hi = net._host(budget, min_labels)
        got = compile_regex(node)
        longest = min(net.LABEL_CAP, (budget + 1) // 4 - 1)
        label = f"[{alnum}](?:[{alnum}-]{{0,{longest - 2}}}[{alnum}])?" if longest > 1 else f"[{alnum}]"
        last = f"[{letters}](?:[{alnum}-]{{0,{longest - 2}}}[{alnum}])?" if longest > 1 else f"[{letters}]"
        want = re.compile(f"(?:{label}\\.){{{min_labels - 1},{net.MAX_LABELS - 1}}}{last}".encode())
        pool = alnum + "-." + "_"
        for _ in range(3000):
            if rng.random() < 0.5:      # near the language: labels of random lengths, joined by dots
                parts = ["".join(rng.choice(alnum + "-") for _ in range(rng.randint(1, longest + 1)))
                         for _ in range(rng.randint(1, net.MAX_LABELS + 1))]
                s = ".".join(parts)
            else:
                s = "".join(rng.choice(pool) for _ in range(rng.randint(0, 12)))
            b = s.encode()
            assert bool(got.fullmatch(b)) == bool(want.fullmatch(b)), (budget, min_labels, s)
            if got.fullmatch(b):
                assert lo <= len(b) <= hi
