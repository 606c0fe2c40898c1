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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=5), min_size=1, max_size=40), st.integers(1, 6), st.randoms(),
       st.integers(1, 30))
def test_walk_finds_every_tokens_move_once_for_each_edge(tokens, n_states, rnd, n_edges):
    """walk against a per-token simulation over the byte table: for each edge (src, byte, state after the byte),
    every token starting with that byte and alive through its last byte gives (src, token, state after it),
    once. Edges repeat (byte, after) pairs often, which walk visits once and hands to every edge."""
    import numpy as np

    from batchmask.table.trie import walk
    trie = FlatVocab(tokens, "cpu").trie
    K = 4
    byte_class = np.array([rnd.randrange(K) for _ in range(256)], dtype=np.int64)
    delta = np.array([[rnd.choice([-1, *range(n_states)]) for _ in range(K)] for _ in range(n_states)],
                     dtype=np.int32)
    firsts = sorted({t[0] for t in tokens}) + [rnd.randrange(256)]
    edges = [(rnd.randrange(3 * n_states), rnd.choice(firsts), rnd.randrange(-1, n_states)) for _ in range(n_edges)]
    edges = list(dict.fromkeys(edges))                                 # each (src, byte) edge once ...
    edges = list({(s, b): (s, b, a) for s, b, a in edges}.values())   # ... with one state after it
    src, byte, after = (np.array(x, dtype=np.int64) for x in zip(*edges))
    got = sorted(zip(*(x.tolist() for x in walk(trie, delta, byte_class, src, byte, after))))
    want = []
    for s, b, a in edges:
        for i, t in enumerate(tokens):
            state = a
            for c in t[1:]:
                state = -1 if state < 0 else int(delta[state, byte_class[c]])
            if t[0] == b and state >= 0:
                want.append((s, i, state))
    assert got == sorted(want)
