"""build._walked_classes (tokens grouped by their walked moves per (byte, after) pair, then those groups by one
token's moves per state) against one refine of every token's moves per state (classes.refine over Walked.moves()):
the same partition of the vocabulary, whichever path the edge counts pick."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchmask.table.build import _walked_classes
from batchmask.table.classes import refine
from batchmask.table.trie import Walked


def same_partition(a: torch.Tensor, b: torch.Tensor) -> bool:
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def random_walk(rng: np.random.Generator, V: int, U: int, S: int, edges_per_pair: int) -> Walked:
    """U pairs, each with 1..edges_per_pair edges (sources drawn from S states, distinct within a pair) and a random
    set of (token, next) finds; a token is found at most once per pair, a (state, token) at most once overall
    (a state's edges have distinct first bytes, so tokens of one pair are not found again from that state)."""
    first_byte = rng.integers(0, 4, V)                        # the byte each token starts with
    pair_byte = rng.integers(0, 4, U)
    src, at, n = [], [], []
    for u in range(U):
        # a state has one edge per byte: the pairs of one byte get disjoint sources
        pool = [s for s in range(S) if (s, pair_byte[u]) not in {(x, pair_byte[w]) for w in range(u) for x in
                                                                 src[at[w]:at[w] + n[w]]}]
        k = min(len(pool), int(rng.integers(1, edges_per_pair + 1)))
        at.append(len(src))
        n.append(k)
        src += list(rng.choice(pool, size=k, replace=False)) if k else []
    pair, tok, nxt = [], [], []
    for u in range(U):
        cand = np.flatnonzero(first_byte == pair_byte[u])
        found = cand[rng.random(len(cand)) < 0.6]
        pair += [u] * len(found)
        tok += found.tolist()
        nxt += rng.integers(0, 3, len(found)).tolist()
    arr = lambda x: np.asarray(x, dtype=np.int64)            # noqa: E731
    return Walked(arr(pair), arr(tok), arr(nxt), arr(src), arr(at), arr(n))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 12), st.integers(1, 6))
def test_two_steps_give_the_classes_of_one(seed, U, edges_per_pair):
    rng = np.random.default_rng(seed)
    V, S = 60, 10
    walked = random_walk(rng, V, U, S, edges_per_pair)
    value_class = torch.from_numpy(np.unique(rng.integers(0, 3, V), return_inverse=True)[1].astype(np.int64))
    from_c = torch.arange(S + 5)
    src, tok, nxt = (torch.from_numpy(x) for x in walked.moves())
    assert len(set(zip(src.tolist(), tok.tolist()))) == len(src)                # each (state, token) once
    want = refine(value_class, tok, src, nxt)
    got, (g_src, g_tok, g_nxt) = _walked_classes(walked, value_class, from_c)
    assert same_partition(got, want)
    # the moves handed back hold every move of at least one token of each class (what the rows are written from)
    firsts = {int(torch.nonzero(got == c)[0]) for c in torch.unique(got).tolist()}      # a token of each class
    full = set(zip(src.tolist(), tok.tolist(), nxt.tolist()))
    back = set(zip(g_src.tolist(), g_tok.tolist(), g_nxt.tolist()))
    assert back <= full
    assert {m for m in full if m[1] in firsts} <= back


def test_a_wrong_merge_is_caught():
    """The partition check sees a grouping that merges two classes the one-step refine keeps apart."""
    a = torch.tensor([0, 0, 1, 1])
    assert same_partition(a, torch.tensor([5, 5, 7, 7]))
    assert not same_partition(a, torch.tensor([5, 5, 5, 7]))
    assert not same_partition(a, torch.zeros(4, dtype=torch.int64))
