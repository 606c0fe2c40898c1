"""Whether two languages of grammar nodes are disjoint: `disjoint(a, b)` proves no byte string is in both.

Used for patternProperties (schema/objects.py): a key written for one pattern must match no other pattern whose
schema differs. Each node is read as a small NFA over bytes whose language *contains* the node's (so a proof
holds for the node): a Repeat's item min times and then any number of times more, a JsonStr / Str / Word body any
run of its characters. The product of the two NFAs is searched for a common accepted string; None when the
search would pass `limit` state pairs (not proved either way: the caller refuses).
"""
from __future__ import annotations

from ..grammar.nodes import Alt, ByteSet, JsonStr, Lit, Node, Repeat, Seq, Str, Word, is_body_byte
from .strings import MAX_CP, char_node

_COPIES = 8                                # a Repeat's minimum kept exactly up to this many copies
_ANY_CHAR = char_node([(0, MAX_CP)])      # one JSON string character, every way JsonStr writes it


class _NFA:
    """States 0..n-1; `eps[s]` ε-successors, `edges[s]` (mask as an int, next state) pairs."""

    def __init__(self):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int]]] = []

    def state(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node: Node, start: int) -> int:
        """Adds `node` from `start`; returns the state its strings end in."""
        if isinstance(node, Lit):
            for b in node.text:
                nxt = self.state()
                self.edges[start].append((1 << b, nxt))
                start = nxt
            return start
        if isinstance(node, ByteSet):
            nxt = self.state()
            self.edges[start].append((sum(1 << b for b in range(256) if node.mask[b]), nxt))
            return nxt
        if isinstance(node, Seq):
            for item in node.items:
                start = self.build(item, start)
            return start
        if isinstance(node, Alt):
            end = self.state()
            for o in node.options:
                self.eps[self.build(o, start)].append(end)
            return end
        if isinstance(node, Repeat):
            for _ in range(min(node.min, _COPIES)):
                start = self.build(node.item, start)
            more = node.max is None or node.max > node.min or node.min > _COPIES
            return self._star(node.item, start) if more else start
        if isinstance(node, JsonStr):
            return self._star(_ANY_CHAR, start)
        if isinstance(node, Str):
            return self._star(ByteSet.of(b for b in range(256) if is_body_byte(b)), start)
        if isinstance(node, Word):
            return self._star(ByteSet(bytes(x | y | z for x, y, z in zip(node.start, node.body, node.end))), start)
        raise TypeError(f"not a grammar node: {node!r}")

    def _star(self, item: Node, start: int) -> int:
        loop = self.state()
        self.eps[start].append(loop)
        self.eps[self.build(item, loop)].append(loop)
        return loop

    def closure(self, states) -> frozenset:
        seen, todo = set(states), list(states)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)


def disjoint(a: Node, b: Node, limit: int = 20000) -> bool | None:
    """True: no byte string is in both languages. False: one is (of the widened NFAs: see the module docstring).
    None: more than `limit` state pairs, undecided."""
    na, nb = _NFA(), _NFA()
    sa, sb = na.state(), nb.state()
    ea, eb = na.build(a, sa), nb.build(b, sb)
    start = (na.closure([sa]), nb.closure([sb]))
    seen, todo = {start}, [start]
    while todo:
        pa, pb = todo.pop()
        if ea in pa and eb in pb:
            return False
        moves_a = [(m, t) for s in pa for m, t in na.edges[s]]
        moves_b = [(m, t) for s in pb for m, t in nb.edges[s]]
        bits = 0
        for m, _ in moves_a:
            bits |= m
        common = 0
        for m, _ in moves_b:
            common |= m & bits
        while common:
            low = common & -common
            common ^= low
            nxt = (na.closure([t for m, t in moves_a if m & low]), nb.closure([t for m, t in moves_b if m & low]))
            if nxt not in seen:
                if len(seen) >= limit:
                    return None
                seen.add(nxt)
                todo.append(nxt)
    return True
