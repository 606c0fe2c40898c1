"""tokensim.explicit_columns against the plain walk: every token fed byte by byte through the byte table from
every explicit state (the walk over the vocabulary trie must neither lose nor invent a move)."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchmask.table.tokensim import ByteSteps, FlatVocab, explicit_columns


def plain(delta: np.ndarray, byte_class: np.ndarray, edges: np.ndarray, tokens: list[bytes]) -> set:
    """{(src, token, next)}: for each edge (src, first byte, state after it), each token starting with that byte."""
    out = set()
    for src, b, after in edges.tolist():
        if after < 0:
            continue
        for t, text in enumerate(tokens):
            if not text or text[0] != b:
                continue
            s = after
            for x in text[1:]:
                s = int(delta[s, byte_class[x]])
                if s < 0:
                    break
            if s >= 0:
                out.add((src, t, s))
    return out


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 12), st.integers(2, 5))
def test_explicit_columns_are_the_plain_walk(seed, S, alphabet):
    rng = np.random.default_rng(seed)
    letters = b"abcde"[:alphabet]
    # tokens of 0..6 bytes over a small alphabet (so groups share prefixes), some twice
    tokens = [bytes(rng.choice(list(letters), size=int(rng.integers(0, 7)))) for _ in range(60)]
    tokens += tokens[:5] + [bytes([x]) for x in letters]
    byte_class = np.zeros(256, dtype=np.int64)
    byte_class[list(letters)] = np.arange(1, alphabet + 1)
    K = alphabet + 1
    delta = np.where(rng.random((S, K)) < 0.6, rng.integers(0, S, (S, K)), -1).astype(np.int32)   # [S, K]
    edges = np.array([(s, int(b), int(delta[s, byte_class[b]])) for s in range(S) for b in letters], dtype=np.int64)
    vocab = FlatVocab(tokens, "cpu")
    steps = ByteSteps.of(delta, byte_class, vocab, "cpu")
    src, tok, nxt = explicit_columns(torch.as_tensor(edges), steps, vocab)
    got = list(zip(src.tolist(), tok.tolist(), nxt.tolist()))
    assert len(got) == len(set(got))                                   # each (state, token) at most once
    assert set(got) == plain(delta, byte_class, edges, tokens)


def _walk_fits(edges, steps, vocab, budget: int) -> bool:
    from batchmask.automaton.nfa import GrammarBuildError
    from batchmask.table.trie import pairs_budget
    with pairs_budget(budget):
        try:
            explicit_columns(torch.as_tensor(edges), steps, vocab)
            return True
        except GrammarBuildError:
            return False


def _least_budget(edges, steps, vocab) -> int:
    return next(b for b in range(1, 10_000) if _walk_fits(edges, steps, vocab, b))


def test_walks_in_one_build_share_one_budget():
    """table/build.py walks the explicit states in two parts inside trie.shared_budget: the second may use only what
    the first left, so the parts are refused exactly where one walk of both would be (budgets add up), and outside
    the block each walk has the whole budget."""
    from batchmask.automaton.nfa import GrammarBuildError
    from batchmask.table.trie import pairs_budget, shared_budget
    rng = np.random.default_rng(5)
    letters = b"abcd"
    tokens = [bytes(rng.choice(list(letters), size=int(rng.integers(1, 6)))) for _ in range(80)]
    byte_class = np.zeros(256, dtype=np.int64)
    byte_class[list(letters)] = np.arange(1, 5)
    S = 6
    delta = np.where(rng.random((S, 5)) < 0.8, rng.integers(0, S, (S, 5)), -1).astype(np.int32)
    delta[:, 1:] = np.maximum(delta[:, 1:], 0)                       # every letter moves on: long walks
    edges = np.array([(s, int(b), int(delta[s, byte_class[b]])) for s in range(S) for b in letters], dtype=np.int64)
    vocab = FlatVocab(tokens, "cpu")
    steps = ByteSteps.of(delta, byte_class, vocab, "cpu")
    part_a, part_b = edges[: len(edges) // 2], edges[len(edges) // 2:]      # distinct (byte, after) within each
    need_a, need_b = _least_budget(part_a, steps, vocab), _least_budget(part_b, steps, vocab)
    assert need_a > 1 and need_b > 1
    for budget, fits in ((need_a + need_b - 1, False), (need_a + need_b, True)):
        with pairs_budget(budget), shared_budget():
            try:
                explicit_columns(torch.as_tensor(part_a), steps, vocab)
                explicit_columns(torch.as_tensor(part_b), steps, vocab)
                got = True
            except GrammarBuildError:
                got = False
        assert got == fits, (budget, need_a, need_b)
    # outside a shared block the second walk does not see the first's spending
    most = max(need_a, need_b)
    assert _walk_fits(part_a, steps, vocab, most) and _walk_fits(part_b, steps, vocab, most)
