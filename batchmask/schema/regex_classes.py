"""The class escapes of a `pattern` (\\d \\w \\s and \\D \\W \\S) as both readings of a pattern see them.

jsonschema matches a pattern with Python's `re` on str, where \\d \\w \\s are Unicode-aware (\\d: every decimal
digit, \\w: every alphanumeric character and '_', \\s: every whitespace character); ECMA-262, JSON Schema's own
reading (and llguidance's), has ASCII \\d and \\w and a \\s of its own. A value we write must satisfy both, and a
superset (schema/overlap.py's `search` reading) must hold what either matches. So each escape has two sets:

    narrow   what both readings match: safe to write
    wide     what either reading may match: what a superset holds, and what a negated class must avoid

    escape   narrow                          wide
    \\d       [0-9]                           Python's \\d (Unicode decimal digits)
    \\w       [0-9A-Za-z_]                    Python's \\w
    \\s       [\\t\\n\\v\\f\\r ]                    Python's \\s and ECMA-262's (Zs, U+2028/9, U+FEFF)
    \\D \\W \\S the complement of the lower case's wide set, resp. narrow set

A negated class complements its items, so it reads them the other way: `[^\\w]` written from \\w's wide set
holds no character either reading calls a word character ('é' is one for Python). Python's sets are read from
`re` itself, once, over every code point: the reference, not a list copied here.
"""
from __future__ import annotations

import functools
import re

import numpy as np

from .strings import MAX_CP, complement, normalize

Ranges = list[tuple[int, int]]

_ASCII = {"d": [(0x30, 0x39)],
          "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
          "s": [(0x09, 0x0D), (0x20, 0x20)]}
_ECMA_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x2028, 0x2029), (0xFEFF, 0xFEFF)]   # beside the Zs category


@functools.cache
def _every_code_point() -> str:
    """str [MAX_CP + 1]: character i is code point i (a surrogate, which no value holds, is NUL: in no set)."""
    cps = np.arange(MAX_CP + 1, dtype="<u4")
    cps[0xD800:0xE000] = 0
    return cps.tobytes().decode("utf-32-le")              # ~15 ms; "".join(map(chr, ...)) takes 350


@functools.cache
def python_set(letter: str) -> Ranges:
    """The code points Python's `re` matches with \\<letter> (d, w or s) in a str pattern, as ranges."""
    return normalize((m.start(), m.end() - 1) for m in re.finditer(rf"\{letter}+", _every_code_point()))


def class_escape(letter: str, wide: bool) -> Ranges:
    """The ranges of the escape \\<letter> (d w s D W S) in the reading asked for (module docstring)."""
    low = letter.lower()
    if letter != low:                                     # \D \W \S: the complement of the other reading
        return complement(class_escape(low, not wide))
    if not wide:
        return list(_ASCII[low])
    # ECMA-262's \s is its WhiteSpace (TAB VT FF SP U+FEFF and the Zs category, which Python's \s holds
    # already: str.isspace takes every Zs character) and its LineTerminators (LF CR U+2028 U+2029)
    extra = _ECMA_SPACE if low == "s" else []
    return normalize(python_set(low) + _ASCII[low] + extra)
