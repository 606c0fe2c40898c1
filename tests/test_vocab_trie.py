"""table/trie.VocabTrie against the vocabulary itself: walking it from the roots spells exactly the distinct
non-empty prefixes of the tokens, each once, and every token ends at the prefix equal to its bytes."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from batchmask.table.tokensim import FlatVocab


def spelled(trie) -> dict:
    """{prefix bytes: sorted tokens spelled so}, by a depth-first walk over the levels' child runs."""
    out = {}
    stack = [(0, i, bytes([int(trie.levels[0].byte[i])])) for i in range(len(trie.levels[0].byte))]
    while stack:
        d, i, text = stack.pop()
        lv = trie.levels[d]
        assert text not in out                                                   # each prefix once
        out[text] = sorted(lv.end_tok[lv.end_at[i]:lv.end_at[i] + lv.end_n[i]].tolist())
        for c in range(lv.child_at[i], lv.child_at[i] + lv.child_n[i]):
            stack.append((d + 1, c, text + bytes([int(trie.levels[d + 1].byte[c])])))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=7), max_size=50))
def test_trie_spells_every_prefix_once(tokens):
    tokens = tokens + tokens[:3] + [b"\x00", b"\xff\x00"]             # equal tokens, zero bytes, byte 255
    trie = FlatVocab(tokens, "cpu").trie
    got = spelled(trie)
    want = {t[:k]: [] for t in tokens for k in range(1, len(t) + 1)}
    for i, t in enumerate(tokens):
        if t:
            want[t].append(i)
    assert got == want
    for b in range(256):
        first = int(trie.first[b])
        assert (first >= 0) == (bytes([b]) in want)
        if first >= 0:
            assert int(trie.levels[0].byte[first]) == b
