"""byte_table's per-block depth from the vocabulary's byte tails (FlatVocab.max_tail) loses no move: the
explicit columns and the after-stop states come out as with the plain bound (every block max_len deep)."""
from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import torch
from data_paths import CATALOGUE

from batchmask.automaton.form import byte_table
from batchmask.compiler.compiled import automaton_of, seed_node
from batchmask.grammar.nodes import Alt, JsonStr, Lit, Seq, Str
from batchmask.table.tokensim import ByteSteps, after_stops, explicit_columns, prepare_vocab
from batchmask.tools.envelope import registry_node
from batchmask.tools.registry import ToolRegistry


def moves(aut, prep, tails):
    vocab = prep.vocab
    delta, byte_class, to_c, from_c = byte_table(aut, vocab.max_len, tails)
    steps = ByteSteps.of(delta, byte_class, vocab, "cpu")
    to_c, from_c = torch.as_tensor(to_c), torch.as_tensor(from_c)
    e = torch.as_tensor(aut.edges).reshape(-1, 3)
    src, tok, nxt = explicit_columns(torch.stack([e[:, 0], e[:, 1], to_c[e[:, 2]].long()], 1), steps, vocab)
    cols = sorted(zip(src.tolist(), tok.tolist(), from_c[nxt].tolist()))
    after = {}
    for vt in aut.value_types():
        blocks = [b for b in aut.blocks if b.vt.name == vt.name]
        events, states = after_stops(prep.signature(vt), blocks, steps, to_c, from_c, vocab)
        after[vt.name] = (events.tolist(), states.tolist())
    return cols, after, len(delta)


def vocabulary():
    rng = random.Random(3)
    words = {bytes([b]) for b in range(256)}
    for lead in (b'"', b"=", b'":"', b'","', b"x="):       # bytes that enter values, then long runs of body text
        for n in (5, 17, 40, 70):
            words.add(lead + bytes(rng.choice(b"ab c\xc3\xa9") for _ in range(n)))
    words |= {bytes(rng.choice(b'ab"=:,{} \\u0') for _ in range(rng.randint(2, 12))) for _ in range(600)}
    return SimpleNamespace(token_bytes=[b""] + sorted(words), eos_id=0)


def test_tail_depth_keeps_every_move():
    reg = ToolRegistry.from_json(str(CATALOGUE))
    grammars = [
        registry_node(reg, "json", 256, None),
        seed_node(ToolRegistry.defaults(), 64),
        Seq((Lit(b"x="), JsonStr(1, 90), Lit(b'"'), JsonStr(0, 80), Lit(b'"}'))),     # a value's exit enters the next
        Alt((Seq((Lit(b'"'), Str(2, 100), Lit(b'"'))), Seq((Lit(b"="), JsonStr(0, 3), Lit(b'"'))))),
    ]
    for tok in (vocabulary(),):
        prep = prepare_vocab(tok, "cpu")
        assert int(prep.vocab.max_tail.max()) == prep.vocab.max_len - 1
        for g in grammars:
            for utf8 in (True, False):
                aut = automaton_of(g, utf8)
                plain, bounded = moves(aut, prep, None), moves(aut, prep, prep.vocab.max_tail)
                assert bounded[:2] == plain[:2]
                assert bounded[2] <= plain[2]


def test_max_tail_by_hand():
    tok = SimpleNamespace(token_bytes=[b"", b"ab", b"a", b'x"yz', b'"', b'""q'], eos_id=0)
    tail = prepare_vocab(tok, "cpu").vocab.max_tail
    want = np.zeros(256, dtype=np.int64)
    for t in tok.token_bytes:
        for i, b in enumerate(t):
            want[b] = max(want[b], len(t) - i - 1)
    assert np.array_equal(tail, want) and tail[ord('"')] == 2
