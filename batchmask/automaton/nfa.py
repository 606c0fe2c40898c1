"""Any tree of grammar/nodes.py's nodes -> a hash-consed NFA (the first half of automaton/tree.py's build).

The NFA is built right to left and hash-consed: a state is (kind, what it reads, where it goes),
and equal states are one state. Equal suffixes of a grammar (every tool's closing `"}}`, say)
are therefore the same NFA states, and two equal value bodies with equal continuations are the
same block. Kinds:

    BYTE   one byte from a set, then `next`        (Lit bytes, ByteSet)
    ALT    any of several states (no byte)          (Alt, optional repeats)
    BLOCK  a value body of a value type, `next` after its closing byte   (Str, JsonStr)
    END    the value is complete

A Repeat without a max is a loop: one ALT state whose options are the item (built before the loop state
itself) and what follows. Every edge goes from a later-built state to an earlier one (ids decrease along a
path) except a loop's edge into its item; an item is never empty, so the shortest completion of a loop state
is always its exit, and the shortest completion of every state is still one pass in id order.
"""
from __future__ import annotations

import numpy as np

from ..grammar.nodes import Alt, ByteSet, JsonStr, Lit, Repeat, Seq, Str, Word
from ..grammar.values import value_type, word_type
from . import extension
from .runs import item_run_type, worth_a_run

BYTE, ALT, BLOCK, END = range(4)

# NFA states of one build, at most: a grammar past it would take tens of seconds to determinise and its table
# (when it had one) would be past any budget; refused in a second or two instead (the largest JSONSchemaBench
# schemas that compile need ~210K: Kubernetes kb_621)
MAX_NFA = 400_000

_ONE_BYTE = tuple(bytes(b) + b"\x01" + bytes(255 - b) for b in range(256))    # the mask of each single byte (built by
# slices: a generator over 65K pairs cost 2 ms of the first compile's imports)


class GrammarBuildError(ValueError):
    """A grammar tree the automaton builder cannot take (malformed, or too large)."""


class NFA:
    """The hash-consed NFA of one or more grammar trees (`build` adds a tree before a continuation state)."""

    def __init__(self, utf8: bool, runs: bool = True):
        self.utf8 = utf8
        self.runs = runs             # wide Repeats of small byte items as value blocks (automaton/runs.py)
        self.runs_made = 0
        self.limit = MAX_NFA         # states at most; several trees in one NFA: MAX_NFA more each (tree.py)
        self.kind: list[int] = []
        self.arg: list = []          # BYTE: mask id; ALT: tuple of states; BLOCK: (value type, min, max)
        self.next: list[int] = []
        self._index: dict = {}
        self.masks: list[bytes] = []
        self._mask_id: dict[bytes, int] = {}
        self._byte_mask = [-1] * 256
        self._built: dict = {}       # (id(node), k) -> state: a subtree met again (a tool in many sets) is not rebuilt
        self._closure: dict = {}
        self._open: dict = {}        # loop state whose item is being built -> (its item's first bytes or None, exit)
        self._stale: list = []       # closures computed while a loop was open (they may miss its item)
        self.loops: list[int] = []   # loop states: hash-consed by a key of their own, not by their options
        self.end = self._add(END, None, -1)

    def _add(self, kind, arg, nxt) -> int:
        key = (kind, arg, nxt)
        i = self._index.get(key)
        if i is None:
            if len(self.kind) >= self.limit:
                raise self.too_large()
            i = self._index[key] = len(self.kind)
            self.kind.append(kind)
            self.arg.append(arg)
            self.next.append(nxt)
        return i

    @staticmethod
    def too_large() -> GrammarBuildError:
        return GrammarBuildError(
            f"grammar: more than {MAX_NFA} automaton states before determinising: the grammar unfolds too far "
            "(a $ref expanded inside itself, a subschema written out again at each of its many uses, bounded "
            "arrays of objects nested in bounded arrays); lower SchemaOptions.ref_depth or max_depth")

    def _mask(self, mask: bytes) -> int:
        i = self._mask_id.get(mask)
        if i is None:
            i = self._mask_id[mask] = len(self.masks)
            self.masks.append(mask)
        return i

    def build(self, node, k: int, where) -> int:
        """The state that reads `node` and then goes on to state `k`.

        Building is deterministic and hash-consed, so the same subtree object before the same `k` gives
        the same state again: it is looked up (the tree holds its nodes, so their ids stay theirs)."""
        if extension.helpers is not None:                       # the same, in C (native_c/nfa.c)
            return extension.helpers.build_node(self, node, k, where)
        key = (id(node), k)
        got = self._built.get(key)
        if got is None:
            got = self._built[key] = self._build(node, k, where)
        return got

    def _build(self, node, k: int, where) -> int:
        if isinstance(node, Lit):
            if not isinstance(node.text, (bytes, bytearray)):
                raise GrammarBuildError(f"{_text(where)}: Lit.text must be bytes, got {type(node.text).__name__}")
            ids = self._byte_mask                    # the mask id of each single byte, once it is made
            for b in reversed(bytes(node.text)):
                m = ids[b]
                if m < 0:
                    m = ids[b] = self._mask(_ONE_BYTE[b])
                k = self._add(BYTE, m, k)
            return k
        if isinstance(node, Seq):
            for i in range(len(node.items) - 1, -1, -1):
                k = self.build(node.items[i], k, (where, ".items", i))
            return k
        if isinstance(node, Alt):
            if not node.options:
                raise GrammarBuildError(f"{_text(where)}: Alt has no options")
            opts = tuple(dict.fromkeys(self.build(o, k, (where, ".options", i)) for i, o in enumerate(node.options)))
            return opts[0] if len(opts) == 1 else self._add(ALT, opts, -1)
        if isinstance(node, ByteSet):
            mask = bytes(node.mask)
            if mask not in self._mask_id and (len(mask) != 256 or mask.translate(None, b"\x00\x01")):
                raise GrammarBuildError(f"{_text(where)}: ByteSet.mask must be 256 bytes of 0/1, got {len(mask)} bytes")
            return self._add(BYTE, self._mask(mask), k)
        if isinstance(node, Repeat):
            _check_bounds(node, where)
            if self.runs and worth_a_run(node):         # a run: a value block (max None: a saturating one)
                vt = item_run_type(node.item, NFA, BYTE)
                if vt is not None and self._plain_end(bytes((vt.table[0] >= 0).astype(np.uint8)), k):
                    self.runs_made += 1
                    return self._add(BLOCK, (vt.name, node.min, node.max), k)
            if node.max is None:
                return self._loop(node, k, where)
            opt = k
            for _ in range(node.max - node.min):          # up to max - min more, each optional
                opt = self._alt(self.build(node.item, opt, (where, ".item", None)), k)
            for _ in range(node.min):
                opt = self.build(node.item, opt, (where, ".item", None))
            return opt
        if isinstance(node, Word):
            _check_bounds(node, where)
            try:
                vt = word_type(node.start, node.body, node.end)
            except ValueError as e:
                raise GrammarBuildError(f"{_text(where)}: {e}") from None
            body = bytes(a | b for a, b in zip(bytes(node.start), bytes(node.body)))
            if not self._plain_end(body, k):
                raise GrammarBuildError(f"{_text(where)}: a Word must be followed by bytes it cannot hold")
            return self._add(BLOCK, (vt.name, node.min, node.max), k)
        if isinstance(node, (Str, JsonStr)):
            _check_bounds(node, where)
            if self.end in self._follow(k)[0]:
                raise GrammarBuildError(f"{_text(where)}: a string body must be followed by its closing quote, "
                                        "not by the end of the grammar")
            vt = value_type("seed" if isinstance(node, Str) else "json", self.utf8)
            return self._add(BLOCK, (vt.name, node.min, node.max), k)
        raise GrammarBuildError(f"{_text(where)}: not a grammar node: {type(node).__name__} "
                                "(expected Lit, Seq, Alt, ByteSet, Repeat, Str or JsonStr)")

    def _loop(self, node: Repeat, k: int, where) -> int:
        """Repeat(item, min, None): min copies of the item, then a loop state: the item again, or on to k.

        The loop state is made first (its options wait for the item, which is built before it); while the
        item is built, what follows the loop is its item's first bytes or k (`_follow`), and the closures
        computed meanwhile are dropped once the loop is closed."""
        first, empty = first_bytes(node.item)
        if empty:
            raise GrammarBuildError(f"{_text(where)}: a Repeat without a max needs an item that is never empty")
        loop = self._add(ALT, ("loop", len(self.kind)), -1)            # a key no other state has
        self.loops.append(loop)
        self._open[loop] = (first, k)
        mark = len(self._stale)
        body = self.build(node.item, loop, (where, ".item", None))
        self.arg[loop] = (body, k)
        del self._open[loop]
        for i in self._stale[mark:]:
            self._closure.pop(i, None)
        del self._stale[mark:]
        out = loop
        for _ in range(node.min):
            out = self.build(node.item, out, (where, ".item", None))
        return out

    def _follow(self, k: int):
        """(the elements of state k, with open loops read through, the first bytes of those loops' items: a
        list of masks, or None where an item starts with something else than a byte)."""
        elems, firsts, todo, seen = [], [], [k], set()
        while todo:
            for e in self.closure(todo.pop()):
                if e in self._open:
                    if e not in seen:
                        seen.add(e)
                        first, exit_ = self._open[e]
                        firsts.append(first)
                        todo.append(exit_)
                else:
                    elems.append(e)
        return elems, firsts

    def _plain_end(self, body: bytes, k: int) -> bool:
        """What follows state k starts with single bytes (no value, not the grammar's end), none of them in
        `body`: where a value of those bytes stops is then plain, as a block needs."""
        after, firsts = self._follow(k)
        if any(e == self.end or isinstance(e, tuple) or self.kind[e] != BYTE for e in after) or None in firsts:
            return False
        follow = 0                     # masks are bytes of 0 and 1: as integers, OR and AND act byte by byte
        for m in [self.masks[self.arg[e]] for e in after] + firsts:
            follow |= int.from_bytes(m, "little")
        return not int.from_bytes(body, "little") & follow

    def _alt(self, a: int, b: int) -> int:
        return a if a == b else self._add(ALT, (a, b), -1)

    def closure(self, i: int, memo: dict | None = None) -> tuple:
        """The elements state i stands for, in priority order (first Alt option first)."""
        memo = self._closure if memo is None else memo
        got = memo.get(i)
        if got is not None:
            return got
        if self._open:
            if i in self._open:
                return (i,)                      # a loop being built: read through by _follow
            self._stale.append(i)
        kind = self.kind[i]
        if kind == ALT:
            out = tuple(dict.fromkeys(e for o in self.arg[i] for e in self.closure(o, memo)))
        elif kind == BLOCK:
            out = ((i, 0, 0),)
        else:
            out = (i,)
        memo[i] = out
        return out



def _text(where) -> str:
    """A node's place in the tree for an error message: where arguments are (parent, field, index) chains,
    spelled out only when an error needs them (building them as text cost more than the build)."""
    parts = []
    while isinstance(where, tuple):
        where, field, i = where
        parts.append(field if i is None else f"{field}[{i}]")
    return str(where) + "".join(reversed(parts))


_NO_BYTES = bytes(256)


def first_bytes(node) -> tuple:
    """(the mask of the bytes a member of `node` may start with, whether `node` may be empty). The mask is None
    where a member may start with a value block (a string body, a Word, a Repeat that may become a run)."""
    if isinstance(node, Lit):
        return (_ONE_BYTE[node.text[0]], False) if node.text else (_NO_BYTES, True)
    if isinstance(node, ByteSet):
        return bytes(node.mask), False
    if isinstance(node, Repeat):
        if worth_a_run(node):
            return None, node.min == 0
        mask, empty = first_bytes(node.item)
        return mask, empty or node.min == 0
    if isinstance(node, (Seq, Alt)):
        is_seq = isinstance(node, Seq)
        mask, empty = 0, is_seq                      # the union as an integer (masks are bytes of 0 and 1)
        for x in (node.items if is_seq else node.options):
            m, e = first_bytes(x)
            mask = None if mask is None or m is None else mask | int.from_bytes(m, "little")
            if is_seq and not e:
                break
            empty = empty or e
        else:
            return (None if mask is None else mask.to_bytes(256, "little")), empty
        return (None if mask is None else mask.to_bytes(256, "little")), False
    return None, getattr(node, "min", 1) == 0          # Str, JsonStr, Word: value blocks


def _check_bounds(node, where):
    if isinstance(node, (Repeat, JsonStr)) and node.max is None:
        if not (isinstance(node.min, int) and node.min >= 0):
            raise GrammarBuildError(f"{_text(where)}: {type(node).__name__} min must be an integer >= 0, "
                                    f"got min={node.min!r}")
        return
    if not (isinstance(node.min, int) and isinstance(node.max, int) and 0 <= node.min <= node.max):
        raise GrammarBuildError(f"{_text(where)}: {type(node).__name__} bounds must be integers 0 <= min <= max, "
                                f"got min={node.min!r}, max={node.max!r}")
