"""The vocabulary as a trie, level by level, and the explicit states' columns walked over it.

A token's move from an explicit state depends on its bytes only, and tokens share prefixes: walking the
trie of the vocabulary (built once per tokenizer, `VocabTrie.of`: one sort of the tokens by their bytes)
carries one (state, prefix) pair per distinct live prefix instead of one (state, token) pair per token
and byte, and a pair dies with its prefix. Levels are numpy arrays: level d holds the distinct prefixes
of d + 1 bytes, sorted by (parent, byte), so a node's children are one contiguous run of the next level.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..automaton.nfa import GrammarBuildError
from .classes import distinct
from .native import helpers

# live (edge, prefix) pairs the explicit states' walk may carry, all levels together, at most (each is stepped,
# and the tokens they spell are grouped, at a few million a second): past it the compile would take from tens of
# seconds to minutes, so it is refused instead. The largest JSONSchemaBench schemas we measured walk ~8M
# (JsonSchemaStore templatesources: 20M before Repeats of wide byte items became blocks, automaton/runs.py)
MAX_PAIRS = 12_000_000
_BUDGET = contextvars.ContextVar("pairs_budget", default=MAX_PAIRS)
_SPENT = contextvars.ContextVar("pairs_spent", default=None)     # [pairs] walked so far in a shared_budget block


@contextlib.contextmanager
def pairs_budget(n: int):
    """Walks inside the block are refused past n live pairs (at most MAX_PAIRS): a first attempt that has a
    cheaper fallback (api.narrower_if_too_large) gives up sooner."""
    token = _BUDGET.set(min(n, MAX_PAIRS))
    try:
        yield
    finally:
        _BUDGET.reset(token)


@contextlib.contextmanager
def shared_budget():
    """The walks inside the block draw on one budget: each is refused past what the walks before it left (a
    table build walks its explicit states in two parts, table/build.py, and they count as one walk)."""
    token = _SPENT.set([0])
    try:
        yield
    finally:
        _SPENT.reset(token)


@contextlib.contextmanager
def unbudgeted():
    """Walks inside the block neither count against nor are refused by a build's budget (a walk of something other
    than the explicit states: tokensim.after_stops' tails, bounded by its own sizes)."""
    tokens = _BUDGET.set(1 << 62), _SPENT.set(None)
    try:
        yield
    finally:
        _SPENT.reset(tokens[1])
        _BUDGET.reset(tokens[0])


def _left() -> int:
    spent = _SPENT.get()
    return _BUDGET.get() - (spent[0] if spent is not None else 0)


@dataclass
class Level:
    """The prefixes of one length d: their last byte, their children's run in level d + 1, their tokens."""
    byte: np.ndarray           # int64 [n]: the last byte of each prefix
    child_at: np.ndarray       # int64 [n]: index of its first child in level d + 1
    child_n: np.ndarray        # int64 [n]: how many children it has
    end_at: np.ndarray         # int64 [n]: index into end_tok of the first token spelled exactly so
    end_n: np.ndarray          # int64 [n]: how many tokens are spelled exactly so (several: equal bytes)
    end_tok: np.ndarray        # int64 [m]: those tokens, grouped by prefix


@dataclass
class VocabTrie:
    levels: list               # [Level]: levels[0] holds the one-byte prefixes
    first: np.ndarray          # int64 [256]: the one-byte prefix of each byte value in levels[0], -1 if none

    @cached_property
    def flat(self) -> tuple:
        """The levels one after another, for the compiled walk (table/native_c/): (byte, child_at, child_n, end_at,
        end_n, end_tok, level_start), int64, with child_at and end_at indexing the whole arrays; checked here once
        (every index the walk follows stays inside), so the walk need not check them each call."""
        sizes = [len(lv.byte) for lv in self.levels]
        level_start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        ends = np.concatenate([[0], np.cumsum([len(lv.end_tok) for lv in self.levels])])
        cat = (lambda xs: np.ascontiguousarray(np.concatenate(xs), dtype=np.int64) if xs else
               np.zeros(0, dtype=np.int64))
        byte = cat([lv.byte for lv in self.levels])
        child_at = cat([lv.child_at + level_start[d + 1] for d, lv in enumerate(self.levels)])
        child_n = cat([lv.child_n for lv in self.levels])
        end_at = cat([lv.end_at + ends[d] for d, lv in enumerate(self.levels)])
        end_n = cat([lv.end_n for lv in self.levels])
        end_tok = cat([lv.end_tok for lv in self.levels])
        N, M = len(byte), len(end_tok)
        if not (np.all((byte >= 0) & (byte < 256) & (child_at >= 0) & (child_n >= 0) & (child_at + child_n <= N) &
                       (end_at >= 0) & (end_n >= 0) & (end_at + end_n <= M)) and np.all(self.first < N)):
            raise ValueError("VocabTrie: a node points outside the trie")
        return byte, child_at, child_n, end_at, end_n, end_tok, level_start

    @classmethod
    def of(cls, token_bytes: list, flat: np.ndarray, offset: np.ndarray, lengths: np.ndarray) -> VocabTrie:
        """From the vocabulary (FlatVocab's flat bytes, offsets and lengths; token_bytes is not read): the tokens
        sorted once by their bytes, so that each level's (parent, byte) keys come sorted and equal ones adjacent
        (no sort per level)."""
        levels = []
        order = _byte_order(flat, offset, lengths)
        live = order[lengths[order] > 0]                      # tokens without bytes are not in the trie
        node = np.zeros(len(live), dtype=np.int64)            # each live token's prefix node so far (root: 0)
        d = 0
        while len(live):
            key = node * 256 + flat[offset[live] + d]
            new = np.empty(len(key), dtype=bool)
            new[0] = True
            np.not_equal(key[1:], key[:-1], out=new[1:])
            node = np.cumsum(new) - 1
            keys = key[new]
            if levels:                                        # the parents' child runs (keys sorted by parent)
                prev = levels[-1]
                prev.child_n = np.bincount(keys // 256, minlength=len(prev.byte))
                prev.child_at = np.cumsum(prev.child_n) - prev.child_n
            n = len(keys)
            ends = lengths[live] == d + 1
            end_n = np.bincount(node[ends], minlength=n)      # ends come in prefix order already
            levels.append(Level(keys % 256, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                                np.cumsum(end_n) - end_n, end_n, live[ends]))
            live, node = live[~ends], node[~ends]
            d += 1
        first = np.full(256, -1, dtype=np.int64)
        if levels:
            first[levels[0].byte] = np.arange(len(levels[0].byte))
        return cls(levels, first)


def _byte_order(flat: np.ndarray, offset: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """int64 [V]: token ids in the order of their bytes (ties by id), as a stable sort of token_bytes would
    give them, but for tokens that differ only by trailing zero bytes (b"a", b"a\\0"), which may come in either
    order: the trie is the same either way (its keys are sorted level by level; tokens of equal bytes keep id order).

    Each token is zero-padded to whole 8-byte words read big-endian, and the words are lexsorted: a few
    numpy passes instead of a Python sort with a key per token (7 ms of the first compile on 32K tokens)."""
    V = len(lengths)
    W = max(1, (int(lengths.max(initial=0)) + 7) // 8)
    padded = np.zeros(V * W * 8, dtype=np.uint8)
    N = int(lengths.sum())
    # byte j of token t goes to t * 8W + j: its flat index shifted by the token's start in each layout
    padded[np.arange(N) + np.repeat(np.arange(V) * (W * 8) - offset, lengths)] = flat[:N] if N else flat[:0]
    words = padded.view(">u8").reshape(V, W).astype(np.uint64)      # native order: numpy compares faster
    return np.lexsort(words.T[::-1]).astype(np.int64, copy=False)    # last key first: word 0 decides first


def spread(at: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Every index of every run [at[i], at[i] + n[i]), run after run: one repeat and one add."""
    total = int(n.sum())
    start = np.cumsum(n) - n
    return np.repeat(at - start, n) + np.arange(total, dtype=at.dtype)


@dataclass
class Walked:
    """A walk's finds per distinct (byte, after) pair of its edges, and the edges of each pair: the moves of edge e are
    its pair's (tok, nxt) with src[e] in front. Grouping tokens by their moves per pair groups them as their moves per
    state would, but finer, on a fraction of the entries (table/build.py refines in two steps on that)."""
    pair: np.ndarray           # int64 [P]: the pair of each find (pairs numbered 0..U-1)
    tok: np.ndarray            # int64 [P]: a token that lives past its last byte from the pair
    nxt: np.ndarray            # int64 [P]: the state after it
    edge_src: np.ndarray       # int64 [E]: the edges' sources, grouped by pair (pair 0's edges first)
    edge_at: np.ndarray        # int64 [U]: where each pair's edges start in edge_src
    edge_n: np.ndarray         # int64 [U]: how many edges each pair has

    def moves(self, keep: np.ndarray | None = None):
        """(src, tok, nxt) int64 of the finds (those where `keep`, bool [P]), each handed to every edge of its pair."""
        pair, tok, nxt = (self.pair, self.tok, self.nxt) if keep is None else (self.pair[keep], self.tok[keep],
                                                                               self.nxt[keep])
        n = self.edge_n[pair]
        return self.edge_src[spread(self.edge_at[pair], n)], np.repeat(tok, n), np.repeat(nxt, n)

    @staticmethod
    def cat(a: Walked, b: Walked) -> Walked:
        """Two walks' finds as one (b's pairs numbered after a's)."""
        U = len(a.edge_at)
        return Walked(np.concatenate([a.pair, b.pair + U]), np.concatenate([a.tok, b.tok]),
                      np.concatenate([a.nxt, b.nxt]), np.concatenate([a.edge_src, b.edge_src]),
                      np.concatenate([a.edge_at, b.edge_at + len(a.edge_src)]), np.concatenate([a.edge_n, b.edge_n]))


def walk(trie: VocabTrie, delta: np.ndarray, byte_class: np.ndarray, src: np.ndarray, byte: np.ndarray,
         after: np.ndarray):
    """Every token that starts with byte[i], fed from state after[i] (byte table delta [Sc, K], -1 illegal,
    byte_class [256]) past its first byte: (src[i], token, state after its last byte) for those that live,
    as int64 arrays (walk_pairs(...).moves())."""
    return walk_pairs(trie, delta, byte_class, src, byte, after).moves()


def walk_pairs(trie: VocabTrie, delta: np.ndarray, byte_class: np.ndarray, src: np.ndarray, byte: np.ndarray,
               after: np.ndarray) -> Walked:
    """walk's finds before they are handed to the edges (Walked). What a walk finds depends on (byte, after) alone,
    and many edges share them (states of many places that enter the same string on its quote): each distinct pair
    is walked once (`_walk_distinct`)."""
    empty = np.zeros(0, dtype=np.int64)
    if not len(src):
        return Walked(empty, empty, empty, empty, empty, empty)
    left = _left()
    key = byte.astype(np.int64) * (delta.shape[0] + 1) + (after.astype(np.int64) + 1)
    by_pair = np.argsort(key, kind="stable")                  # the edges of pair 0, then of pair 1, ...
    sorted_key = key[by_pair]
    start = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])    # [U] each pair's first edge in by_pair
    first = by_pair[start]                                    # an edge of each pair
    count = np.diff(np.r_[start, len(key)])
    pair, tok, nxt = _walk_distinct(trie, delta, byte_class, np.arange(len(start)), byte[first], after[first], src)
    if int(count[pair].sum()) > left:                         # as many (state, token) moves as the walk could find
        _refuse(src)
    return Walked(pair, tok, nxt, src[by_pair].astype(np.int64, copy=False), start, count)


def _refuse(src: np.ndarray):
    raise GrammarBuildError(
        f"grammar: more than {_BUDGET.get()} token prefixes live out of its {len(distinct(src))} explicit states "
        "(states where thousands of tokens are legal, many of them: a string whose alternatives stay open side by "
        "side, such as pattern alternatives, written out again for every array item and property)")


def _walk_distinct(trie: VocabTrie, delta: np.ndarray, byte_class: np.ndarray, src: np.ndarray, byte: np.ndarray,
                   after: np.ndarray, states: np.ndarray):
    """walk's work, for edges of distinct (byte, after): one step per trie level over the live (edge, prefix)
    pairs; the pairs' state ids stay in delta's dtype (the walk is memory-bound). `states`: the explicit states
    a refusal counts."""
    K = delta.shape[1]
    if helpers is not None and delta.dtype == np.int32 and delta.flags.c_contiguous:   # the same levels, in C
        got = helpers.walk(*trie.flat, delta, K, np.ascontiguousarray(byte_class, dtype=np.int64), trie.first,
                           *(np.ascontiguousarray(x, dtype=np.int64) for x in (src, byte, after)), _left())
        if got is None:
            _refuse(states)
        spent = _SPENT.get()
        if spent is not None:
            spent[0] += got[3]
        return tuple(np.frombuffer(x, dtype=np.int64) for x in got[:3])
    wide = np.int64 if delta.size >= 1 << 31 else np.int32        # cur * K + class must not wrap
    flat_delta = delta.reshape(-1)
    cls = byte_class.astype(wide)
    node = trie.first[byte]
    ok = (after >= 0) & (node >= 0)
    who, node, cur = src[ok], node[ok], after[ok].astype(wide)
    out_src, out_tok, out_next = [], [], []
    found = tried = 0
    limit = _left()
    for d, lv in enumerate(trie.levels):
        n = lv.end_n[node]                                     # the tokens spelled by these prefixes end here
        found += len(node)                                     # the work: live (edge, prefix) pairs walked
        if found > limit or tried > 2 * limit:
            _refuse(states)
        out_tok.append(lv.end_tok[spread(lv.end_at[node], n)])
        out_src.append(np.repeat(who, n))
        out_next.append(np.repeat(cur, n))
        if d + 1 == len(trie.levels):
            break
        n = lv.child_n[node]
        tried += int(n.sum())                                  # the children stepped (most die at once)
        if tried > 2 * limit:
            continue                                           # refused above, before they are spread
        child = spread(lv.child_at[node], n)
        nxt = flat_delta[np.repeat(cur * K, n) + cls[trie.levels[d + 1].byte[child]]]
        keep = nxt >= 0
        who, node, cur = np.repeat(who, n)[keep], child[keep], nxt[keep].astype(wide)
        if not len(node):
            break
    spent = _SPENT.get()
    if spent is not None:
        spent[0] += found
    return tuple(np.concatenate(x).astype(np.int64, copy=False) if x else np.zeros(0, dtype=np.int64)
                 for x in (out_src, out_tok, out_next))
