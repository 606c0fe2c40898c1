"""Runs (automaton/runs.py): a wide Repeat of a small byte item compiled as a value block. Checked token by token
against a regex of the same language (test_compile_node's Reference), on a synthetic vocabulary and on Llama 2's;
and the fast refusals of grammars that unfold too far (nfa.MAX_NFA)."""
from __future__ import annotations

import random
import time

import pytest
from test_compile_node import Reference, llama, walk  # noqa: F401  (fixture)
from test_words import pieces_vocab

from batchmask.automaton import nfa
from batchmask.compiler.compiled import compile_node
from batchmask.grammar.nodes import Alt, ByteSet, Lit, Repeat, Seq

ALNUM = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
PCT = Seq((Lit(b"%"), ByteSet.of(b"0123456789abcdef"), ByteSet.of(b"0123456789abcdef")))
GRAMMARS = {        # name -> (tree, whether it holds a run)
    "chars": (Seq((Lit(b'"'), Repeat(ByteSet.of(ALNUM + b"-._~"), 2, 30), Lit(b'"'))), True),
    "escapes": (Seq((Lit(b'"'), Repeat(Alt((ByteSet.of(ALNUM + b"-._~"), PCT)), 0, 12), Lit(b'"}'))), True),
    "segments": (Seq((Lit(b"<"), Repeat(Seq((Lit(b"/"), Repeat(Alt((ByteSet.of(ALNUM), PCT)), 0, 5))), 1, 3),
                      Alt((Lit(b">"), Seq((Lit(b"?"), Repeat(ByteSet.of(ALNUM + b"/?"), 0, 9), Lit(b">"))))))), True),
    "beside": (Seq((Lit(b"("), Alt((Repeat(ByteSet.of(ALNUM), 0, 9), Lit(b"abc;"))), Lit(b")"))), True),
    "narrow": (Seq((Lit(b"["), Repeat(ByteSet.of(b"0123456789"), 1, 20), Lit(b"]"))), False),
}


def blocks_of_runs(g) -> int:
    return sum(b.vt.name.startswith("run-") for b in g.automaton.blocks)


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_runs_match_the_reference(name, llama):  # noqa: F811
    node, has_run = GRAMMARS[name]
    for vocab in (pieces_vocab(len(name)), llama):
        g = compile_node(node, vocab, key={"test": name})
        assert bool(blocks_of_runs(g)) == has_run
        ref = Reference(node, True, vocab.token_bytes, tuple(getattr(vocab, "stop_ids", (vocab.eos_id,))))
        rng = random.Random(name)
        for stay_bias in (0.0, 0.9, 0.97):
            walk(g, ref, rng, stay_bias, max_steps=80)


def test_a_grammar_that_unfolds_too_far_is_refused_fast(llama):  # noqa: F811
    item = Seq((Lit(b"{"), Repeat(Lit(b"ab"), 0, 30), Lit(b"}")))
    node = Seq((Lit(b"["), Repeat(Seq((Lit(b"["), Repeat(Seq((item, Lit(b","))), 0, 100), Lit(b"],"))), 0, 100),
                Lit(b"]")))
    t = time.perf_counter()
    with pytest.raises(nfa.GrammarBuildError, match="automaton states before determinising"):
        compile_node(node, llama, key={})
    assert time.perf_counter() - t < 30


def test_runs_side_by_side_past_max_parallel_are_unrolled_instead():
    """Two runs open together are parallel values (explicit states, counted against MAX_PARALLEL); unrolled, the
    same Repeats were plain explicit states, so the tree is built again without runs rather than refused."""
    from batchmask.automaton.tree import MAX_PARALLEL
    n = MAX_PARALLEL + 200
    node = Seq((Lit(b'"'), Alt((Repeat(ByteSet.of(ALNUM), 0, n), Repeat(ByteSet.of(ALNUM[:40] + b"-"), 0, n))),
                Lit(b'"')))
    vocab = pieces_vocab(7)
    g = compile_node(node, vocab, key={})
    assert not blocks_of_runs(g)
    ref = Reference(node, True, vocab.token_bytes, (vocab.eos_id,))
    walk(g, ref, random.Random(2), 0.9, max_steps=60)


def test_an_item_that_loops_inside_itself_is_no_run():
    """`(\\w+\\.)+\\d+` (JSONSchemaBench Github_trivial o35155): the outer repeat's item holds a loop of its own, so
    its sub-states cycle without completing a unit; it stays a loop of the automaton. Checked token by token through
    the compiled table against Python's re, which defines the pattern."""
    import re

    from test_schema_unbounded import accepted
    schema = {"type": "string", "pattern": "^(\\w+\\.)+\\d+$"}
    for text in ("ab.c.12", "a.1", "a1", ".1", "ab.c.", "x_y.zz.0042"):
        assert accepted(schema, '"' + text + '"') is bool(re.fullmatch(r"(\w+\.)+\d+", text, re.ASCII)), text
