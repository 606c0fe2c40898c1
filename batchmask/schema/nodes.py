"""Small builders over the grammar nodes, shared by the schema front-end, and a node matcher.

The builders keep trees small and flat (nested Seq/Alt merged, adjacent literals joined, empty
literals dropped) so the automaton builder sees few nodes. `lex_range` is the one range
construction behind decimal digit ranges (integers, numbers, dates) and UTF-8 code point ranges:
both are fixed-width strings whose order is the order of their "digits".

`node_accepts(node, data)` says whether `data` is in a node's language. The front-end uses it to
drop enum/const values that sibling keywords refuse; it walks the tree with a set of positions,
so it never backtracks exponentially.
"""
from __future__ import annotations

from ..grammar.nodes import Alt, ByteSet, JsonStr, Lit, Node, Repeat, Seq, Str, is_body_byte

__all__ = ["alt", "byte_range", "bytes_of", "lex_range", "lit", "node_accepts", "opt", "seq", "DIGIT", "EMPTY",
           "without_covered_literals"]


# --- builders ---------------------------------------------------------------------------------------
def lit(text: bytes | str) -> Lit:
    return Lit(text.encode() if isinstance(text, str) else bytes(text))


EMPTY = Lit(b"")


def seq(*items: Node) -> Node:
    out: list = []
    for it in items:
        parts = it.items if isinstance(it, Seq) else (it,)
        for p in parts:
            if isinstance(p, Lit):
                if not p.text:
                    continue
                if out and isinstance(out[-1], Lit):
                    out[-1] = Lit(out[-1].text + p.text)
                    continue
            out.append(p)
    if not out:
        return EMPTY
    return out[0] if len(out) == 1 else Seq(tuple(out))


def alt(*options: Node) -> Node:
    """One of `options` (order kept: ties in `finish` go to the first). Duplicates are dropped."""
    out: list = []
    seen: set = set()
    for o in options:
        for p in (o.options if isinstance(o, Alt) else (o,)):
            if p not in seen:
                seen.add(p)
                out.append(p)
    if not out:
        raise ValueError("alt() of nothing")
    return out[0] if len(out) == 1 else Alt(tuple(out))


def without_covered_literals(node: Node, most: int = 256) -> Node:
    """An Alt whose literal options (enum and const values) another option also accepts, without them: the same
    language, and an enum beside a free string (anyOf [enum, {minLength: 1}]) is then one string, not explicit
    states that follow the enum's text side by side with the string's body. At most `most` literals are looked
    at, against options of at most SMALL_OPTION nodes (a string schema, not an object's whole tree); an option
    node_accepts cannot read (a Word) accepts none."""
    if not isinstance(node, Alt):
        return node
    lits = [o for o in node.options if isinstance(o, Lit)]
    others = [o for o in node.options if not isinstance(o, Lit) and small(o, SMALL_OPTION)]
    if not lits or not others or len(lits) > most:
        return node

    def covered(text: bytes) -> bool:
        for o in others:
            try:
                if node_accepts(o, text):
                    return True
            except TypeError:
                continue
        return False
    kept = [o for o in node.options if not (isinstance(o, Lit) and covered(o.text))]
    return node if len(kept) == len(node.options) else alt(*kept)


SMALL_OPTION = 64


def small(node: Node, limit: int) -> bool:
    """Whether the tree below `node` has at most `limit` nodes (shared ones counted once)."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if len(seen) > limit:
            return False
        if isinstance(n, Seq):
            todo.extend(n.items)
        elif isinstance(n, Alt):
            todo.extend(n.options)
        elif isinstance(n, Repeat):
            todo.append(n.item)
    return True


def unfolds_within(node: Node, limit: int) -> bool:
    """Whether `node` written out as the automaton writes it (a shared subtree once per use, a bounded Repeat's
    item once per count) has at most `limit` nodes: roughly its NFA states (automaton/nfa.py)."""
    sizes: dict = {}

    def size(n) -> int:
        got = sizes.get(id(n))
        if got is None:
            if isinstance(n, (Seq, Alt)):
                got = 1
                for part in (n.items if isinstance(n, Seq) else n.options):
                    got += size(part)
                    if got > limit:
                        break
            elif isinstance(n, Repeat):
                got = 1 + size(n.item) * max(1, n.max if n.max is not None else n.min)
            else:
                got = 1
            sizes[id(n)] = got = min(got, limit + 1)
        return got
    return size(node) <= limit


def opt(node: Node) -> Node:
    """`node` or nothing; nothing first, so `finish` prefers leaving it out."""
    return alt(EMPTY, node)


def bytes_of(allowed) -> ByteSet:
    return ByteSet.of(allowed)


def byte_range(lo: int, hi: int) -> ByteSet:
    return ByteSet.of(range(lo, hi + 1))


DIGIT = byte_range(0x30, 0x39)


def lex_range(lo: bytes, hi: bytes, low: int, high: int) -> Node:
    """Every byte string s with len(s) == len(lo) == len(hi) and lo <= s <= hi, where every byte
    after the first ranges over low..high (the first over lo[0]..hi[0]).

    Decimal digits use low..high = '0'..'9'; UTF-8 continuation bytes 0x80..0xBF.
    """
    assert len(lo) == len(hi) and lo <= hi
    n = len(lo)
    if n == 0:
        return EMPTY
    i = 0
    while i < n and lo[i] == hi[i]:
        i += 1
    if i == n:
        return lit(lo)
    head, lo, hi = lo[:i], lo[i:], hi[i:]
    k = len(lo) - 1
    if k == 0:
        return seq(lit(head), byte_range(lo[0], hi[0]))
    full = Repeat(byte_range(low, high), k, k)
    bottom, top = bytes([low]) * k, bytes([high]) * k
    low_full, high_full = lo[1:] == bottom, hi[1:] == top
    first = lo[0] if low_full else lo[0] + 1
    last = hi[0] if high_full else hi[0] - 1
    parts = []
    if not low_full:
        parts.append(seq(lit(lo[:1]), lex_range(lo[1:], top, low, high)))
    if first <= last:
        parts.append(seq(byte_range(first, last), full))
    if not high_full:
        parts.append(seq(lit(hi[:1]), lex_range(bottom, hi[1:], low, high)))
    return seq(lit(head), alt(*parts))


# --- matcher ----------------------------------------------------------------------------------------
_SHORT_ESCAPES = {ord('"'): 0x22, ord("\\"): 0x5C, ord("b"): 8, ord("f"): 12, ord("n"): 10, ord("r"): 13,
                  ord("t"): 9}
_HEX = b"0123456789abcdefABCDEF"


def _must_escape(cp: int) -> bool:
    return cp < 0x20 or cp == 0x7F or cp in (0x22, 0x5C)


def json_char_at(data: bytes, p: int) -> int:
    """End of the JSON string character at data[p:] under JsonStr's rule, or -1 if there is none."""
    if p >= len(data):
        return -1
    b = data[p]
    if b == 0x5C:
        if p + 1 < len(data) and data[p + 1] in _SHORT_ESCAPES:
            return p + 2
        u = data[p + 1:p + 6]
        if len(u) == 5 and u[:1] == b"u" and all(c in _HEX for c in u[1:]):
            return p + 6 if _must_escape(int(u[1:], 16)) else -1
        return -1
    n = 1 if b < 0x80 else 2 if 0xC2 <= b <= 0xDF else 3 if 0xE0 <= b <= 0xEF else 4 if 0xF0 <= b <= 0xF4 else 0
    if n == 0:
        return -1
    try:
        ch = data[p:p + n].decode("utf-8")
    except UnicodeDecodeError:
        return -1
    return -1 if len(ch) != 1 or _must_escape(ord(ch)) else p + n


def _ends(node: Node, data: bytes, starts: frozenset) -> frozenset:
    if not starts:
        return starts
    if isinstance(node, Lit):
        t = node.text
        return frozenset(p + len(t) for p in starts if data.startswith(t, p))
    if isinstance(node, Seq):
        for it in node.items:
            starts = _ends(it, data, starts)
        return starts
    if isinstance(node, Alt):
        return frozenset().union(*(_ends(o, data, starts) for o in node.options))
    if isinstance(node, ByteSet):
        return frozenset(p + 1 for p in starts if p < len(data) and node.mask[data[p]])
    if isinstance(node, Repeat):
        out = set(starts) if node.min == 0 else set()      # positions after min..i-1 items
        cur = starts
        i = 0
        while node.max is None or i < node.max:          # a loop ends once nothing new is reached
            i += 1
            cur = _ends(node.item, data, cur)
            # Nothing new can come once every position is one already reached after >= min items.
            if not cur or (i > node.min and cur <= out):
                break
            if i >= node.min:
                out |= cur
        return frozenset(out)
    if isinstance(node, (JsonStr, Str)):
        out = set()
        for p in starts:
            n = 0
            if node.min == 0:
                out.add(p)
            while node.max is None or n < node.max:
                if isinstance(node, Str):
                    p = p + 1 if p < len(data) and is_body_byte(data[p]) else -1
                else:
                    p = json_char_at(data, p)
                if p < 0:
                    break
                n += 1
                if n >= node.min:
                    out.add(p)
        return frozenset(out)
    raise TypeError(f"not a grammar node: {node!r}")


def node_accepts(node: Node, data: bytes) -> bool:
    """Is `data` (whole) in the language of `node`?"""
    return len(data) in _ends(node, data, frozenset((0,)))
