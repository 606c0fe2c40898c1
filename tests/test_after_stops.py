"""tokensim.after_stops against a byte-by-byte reference: for every block and every stop event whose ending byte
ends it, the rest of the token (the bytes after that byte) fed through the byte table from the state the ending byte
leads to. Both ways after_stops works it out are checked: run pair by pair (few blocks an ending byte ends) and the
rests walked over their trie from the blocks' distinct starts (many)."""
from __future__ import annotations

import pytest
import torch
from batchmask.models.tokenizer import load_tokenizer
from data_paths import CATALOGUE, LLAMA2

import batchmask.table.tokensim as tokensim
from batchmask.automaton.form import byte_table
from batchmask.compiler.compiled import automaton_of
from batchmask.table.tokensim import ByteSteps, after_stops, prepare_vocab
from batchmask.tools.envelope import registry_node
from batchmask.tools.registry import ToolRegistry


def reference(aut, prep, sig, blocks, delta, byte_class, to_c, from_c) -> dict:
    """{(block index, event): state after the rest, -1 if it dies} for every event whose ending byte ends the block."""
    flat = prep.vocab._token_bytes
    out = {}
    for k, blk in enumerate(blocks):
        for e, (t, p, b) in enumerate(zip(sig.ev_tok.tolist(), sig.ev_pos.tolist(), sig.ev_byte.tolist())):
            start = int(blk.exits[b])
            if start < 0:
                continue
            s = int(to_c[start])
            for x in flat[t][p + 1:]:
                if s < 0:
                    break
                s = int(delta[s, byte_class[x]])
            out[(k, e)] = int(from_c[s]) if s >= 0 else -1
    return out


@pytest.mark.parametrize("walk_from", [0, 10**9])
def test_after_stops_is_the_byte_by_byte_rest(monkeypatch, walk_from):
    monkeypatch.setattr(tokensim, "_WALK_FROM", walk_from)        # 0: always the walk; huge: always pair by pair
    tok = load_tokenizer(str(LLAMA2 / "tokenizer.model"))
    prep = prepare_vocab(tok, "cpu")
    aut = automaton_of(registry_node(ToolRegistry.from_json(str(CATALOGUE)), "json", 256, None), True)
    delta, byte_class, to_c, from_c = byte_table(aut, prep.vocab.max_len, prep.vocab.max_tail)
    steps = ByteSteps.of(delta, byte_class, prep.vocab, "cpu")
    checked = 0
    for vt in aut.value_types():
        blocks = [b for b in aut.blocks if b.vt.name == vt.name]
        sig = prep.signature(vt)
        events, after = after_stops(sig, blocks, steps, torch.as_tensor(to_c), torch.as_tensor(from_c), prep.vocab)
        want = reference(aut, prep, sig, blocks, delta, byte_class, to_c, from_c)
        col = {int(e): j for j, e in enumerate(events.tolist())}
        assert {e for _, e in want} <= set(col)                        # every event some block's byte ends is kept
        for (k, e), s in want.items():
            assert int(after[k, col[e]]) == s, (vt.name, k, e)
        ended = {(k, col[e]) for k, e in want}
        assert all(int(after[k, j]) == -1 for k in range(len(blocks)) for j in range(after.shape[1])
                   if (k, j) not in ended)                              # the others are illegal
        checked += len(want)
    assert checked > 1000
