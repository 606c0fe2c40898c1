"""Test helpers for the schema front-end, written apart from batchmask's builders.

`to_regex(node)` turns a node tree into a Python `re` bytes pattern. Its JSON string character comes
from RFC 8259 and RFC 3629's table of well-formed UTF-8 (not from batchmask.grammar.utf8 or schema_strings).
`walk(node, rng)` draws one random member of a node's language (a random walk over the tree).
"""
from __future__ import annotations

import random
import re

from batchmask.grammar.nodes import Alt, ByteSet, JsonStr, Lit, Repeat, Seq, Str, Word

# One JSON string character as JsonStr writes it: raw well-formed UTF-8 (RFC 3629 table 3-7) except
# '"', '\\', U+0000-U+001F and U+007F; the short escapes; \u00XX for exactly the characters that may not be raw.
_RAW = (rb"[\x20\x21\x23-\x5b\x5d-\x7e]|[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]"
        rb"|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}"
        rb"|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2}")
_ESC = rb'\\["\\bfnrt]|\\u00[01][0-9a-fA-F]|\\u007[fF]'
JSON_CHAR = b"(?:" + _RAW + b"|" + _ESC + b")"
SEED_BYTE = rb"[\x20\x21\x23-\x5b\x5d-\xff]"


def to_regex(node) -> bytes:
    if isinstance(node, Lit):
        return re.escape(node.text)
    if isinstance(node, Seq):
        return b"".join(to_regex(i) for i in node.items)
    if isinstance(node, Alt):
        return b"(?:" + b"|".join(to_regex(o) for o in node.options) + b")"
    if isinstance(node, ByteSet):
        members = [b for b in range(256) if node.mask[b]]
        assert members, "empty ByteSet"
        return b"[" + b"".join(b"\\x%02x" % b for b in members) + b"]"
    if isinstance(node, Repeat):
        return b"(?:" + to_regex(node.item) + b")" + _times(node.min, node.max)
    if isinstance(node, JsonStr):
        return JSON_CHAR + _times(node.min, node.max)
    if isinstance(node, Str):
        return SEED_BYTE + b"{%d,%d}" % (node.min, node.max)
    if isinstance(node, Word):              # one byte of start and end; or start, body..., end
        start, body, end = (_members(m) for m in (node.start, node.body, node.end))
        forms = [b""] if node.min == 0 else []
        if node.min <= 1 <= node.max and set(start) & set(end):
            forms.append(_class(sorted(set(start) & set(end))))
        if node.max >= 2:
            forms.append(_class(start) + _class(body) + b"{%d,%d}" % (max(0, node.min - 2), node.max - 2)
                         + _class(end))
        return b"(?:" + b"|".join(forms) + b")"
    raise TypeError(node)


def _times(lo: int, hi: int | None) -> bytes:
    """A regex repetition {lo,hi}; hi None: {lo,} (no max)."""
    return b"{%d,}" % lo if hi is None else b"{%d,%d}" % (lo, hi)


def _members(mask) -> list[int]:
    return [b for b in range(256) if mask[b]]


def _class(members) -> bytes:
    return b"[" + b"".join(b"\\x%02x" % b for b in members) + b"]"


def compile_regex(node) -> re.Pattern:
    return re.compile(to_regex(node), re.DOTALL)


# --- random members -------------------------------------------------------------------------------
_SPECIAL = ['"', "\\", "\n", "\t", "\r", "\b", "\f", "\x00", "\x1f", "\x7f", "\x0b"]
_SAMPLES = ["é", "ß", "€", "中", "😀", "\u2028", "\ufffd", "\U0010ffff", "\u0800", "\ud7ff", "\ue000", "\x80"]


def random_char(rng: random.Random) -> bytes:
    """One JSON body character, raw or escaped, over a spread of the character classes."""
    r = rng.random()
    if r < 0.5:
        c = chr(rng.choice([x for x in range(0x20, 0x7F) if x not in (0x22, 0x5C)]))
        return c.encode()
    if r < 0.7:
        return rng.choice(_SAMPLES).encode()
    if r < 0.8:
        cp = rng.choice([rng.randint(0x80, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])
        return chr(cp).encode()
    c = rng.choice(_SPECIAL)
    short = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}
    if c in short and (c in '"\\' or rng.random() < 0.6):
        return short[c].encode()
    h = "%04x" % ord(c)
    return ("\\u" + (h.upper() if rng.random() < 0.3 else h)).encode()


def _count(rng, lo, hi, push):
    if hi is None:                      # no max: a few more than the minimum, now and then many more
        hi = lo + (300 if push and rng.random() < 0.2 else 12)
    if push and rng.random() < 0.3:
        return rng.choice([lo, hi])
    return rng.randint(lo, min(hi, lo + 12)) if rng.random() < 0.8 else rng.randint(lo, hi)


def walk(node, rng: random.Random, push: bool = True) -> bytes:
    if isinstance(node, Lit):
        return node.text
    if isinstance(node, Seq):
        return b"".join(walk(i, rng, push) for i in node.items)
    if isinstance(node, Alt):
        return walk(rng.choice(node.options), rng, push)
    if isinstance(node, ByteSet):
        return bytes([rng.choice([b for b in range(256) if node.mask[b]])])
    if isinstance(node, Repeat):
        return b"".join(walk(node.item, rng, push) for _ in range(_count(rng, node.min, node.max, push)))
    if isinstance(node, JsonStr):
        return b"".join(random_char(rng) for _ in range(_count(rng, node.min, node.max, push)))
    if isinstance(node, Word):
        start, body, end = (_members(m) for m in (node.start, node.body, node.end))
        n = _count(rng, node.min, node.max, push)
        if n == 0:
            return b""
        if n == 1:
            return bytes([rng.choice(sorted(set(start) & set(end)))])
        return bytes([rng.choice(start)] + [rng.choice(body) for _ in range(n - 2)] + [rng.choice(end)])
    raise TypeError(node)
