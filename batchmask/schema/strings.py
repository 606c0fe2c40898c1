"""String bodies beyond JsonStr: one JSON character from a set of code points, and `format`s.

A character of a JSON string body is written the way JsonStr writes it (batchmask/grammar/nodes.py):
raw UTF-8 for every character that may be raw; `\\"` and `\\\\` for the quote and the backslash;
for U+0000-U+001F and U+007F the short escape where there is one (\\b \\f \\n \\r \\t) and
`\\u00XX` (either case of hex letter) always. So a set of code points becomes a few byte sets,
a few escape literals and, for non-ASCII ranges, UTF-8 sequences built by `lex_range` (the
continuation bytes of one encoded length are "digits" 0x80..0xBF). Surrogates are never written.

Formats (RFC 3339 and RFC 4122, as jsonschema's format checker reads them):
    date       YYYY-MM-DD, year 0001-9999, the exact days of each month, 29 February only in leap years
    time       HH:MM:SS[.frac](Z|+HH:MM|-HH:MM), hours 00-23, seconds 00-59 (no leap second: the checker
               refuses 60), fraction digits of any length (or 1..fraction_digits), 'Z' or 'z'
    date-time  date, 'T' or 't', time
    uuid       8-4-4-4-12 hex digits, either case
    ipv4, hostname, email, uri: batchmask/schema/formats_net.py
"""
from __future__ import annotations

from ..grammar.nodes import Node, Repeat
from .formats_net import email_node, hostname_node, ipv4_node, ipv6_node, uri_node, uri_reference_node
from .nodes import DIGIT, alt, bytes_of, lex_range, lit, opt, seq

MAX_CP = 0x10FFFF
_SHORT = {0x08: b"b", 0x09: b"t", 0x0A: b"n", 0x0C: b"f", 0x0D: b"r", 0x22: b'"', 0x5C: b"\\"}
_HEXES = "0123456789abcdef"


def must_escape(cp: int) -> bool:
    return cp < 0x20 or cp == 0x7F or cp in (0x22, 0x5C)


def normalize(ranges) -> list[tuple[int, int]]:
    """Sorted, merged, surrogate-free inclusive code point ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi)):
            if a > b:
                continue
            if out and a <= out[-1][1] + 1:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
    return [(a, b) for a, b in out]


def complement(ranges) -> list[tuple[int, int]]:
    out, nxt = [], 0
    for lo, hi in normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CP:
        out.append((nxt, MAX_CP))
    return normalize(out)


def _escape_node(cps: list[int]) -> Node | None:
    """The escapes of characters that may not be raw."""
    if not cps:
        return None
    short = bytes_of(_SHORT[c][0] for c in cps if c in _SHORT) if any(c in _SHORT for c in cps) else None
    by_high: dict[int, set[int]] = {}
    for c in cps:
        if c not in (0x22, 0x5C):
            by_high.setdefault(c >> 4, set()).add(c & 15)
    hexes = []
    for high, lows in sorted(by_high.items()):
        lo_bytes = set()
        for n in lows:
            lo_bytes.update({ord(_HEXES[n]), ord(_HEXES[n].upper())})
        hexes.append(seq(lit(f"u00{high:x}"), bytes_of(sorted(lo_bytes))))
    options = ([short] if short is not None else []) + hexes
    return seq(lit(b"\\"), alt(*options))


def _utf8_ranges(lo: int, hi: int) -> list[Node]:
    parts = []
    for a, b in ((0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CP)):
        x, y = max(lo, a), min(hi, b)
        if x <= y:
            parts.append(lex_range(chr(x).encode(), chr(y).encode(), 0x80, 0xBF))
    return parts


def char_node(ranges) -> Node | None:
    """One JSON body character from the code point ranges (module docstring); None if the set is empty."""
    ranges = normalize(ranges)
    raw_ascii, escaped, parts = [], [], []
    for lo, hi in ranges:
        for c in range(lo, min(hi, 0x7F) + 1):
            (escaped if must_escape(c) else raw_ascii).append(c)
        if hi >= 0x80:
            parts.extend(_utf8_ranges(max(lo, 0x80), hi))
    if raw_ascii:
        parts.insert(0, bytes_of(raw_ascii))
    esc = _escape_node(escaped)
    if esc is not None:
        parts.append(esc)
    return alt(*parts) if parts else None


# --- formats ----------------------------------------------------------------------------------------
def _two(lo: int, hi: int) -> Node:
    return lex_range(b"%02d" % lo, b"%02d" % hi, 0x30, 0x39)


def date_node() -> Node:
    year = lex_range(b"0001", b"9999", 0x30, 0x39)
    # Leap years: the last two digits a nonzero multiple of 4, or a multiple of 4 followed by 00 (0000 is no year).
    mult4_nonzero = alt(seq(lit(b"0"), bytes_of(b"48")), seq(bytes_of(b"2468"), bytes_of(b"048")),
                        seq(bytes_of(b"13579"), bytes_of(b"26")))
    leap = alt(seq(Repeat(DIGIT, 2, 2), mult4_nonzero), seq(mult4_nonzero, lit(b"00")))
    return alt(
        seq(year, lit(b"-"), alt(seq(lit(b"0"), bytes_of(b"13578")), seq(lit(b"1"), bytes_of(b"02"))),
            lit(b"-"), _two(1, 31)),
        seq(year, lit(b"-"), alt(seq(lit(b"0"), bytes_of(b"469")), lit(b"11")), lit(b"-"), _two(1, 30)),
        seq(year, lit(b"-02-"), _two(1, 28)),
        seq(leap, lit(b"-02-29")))


def time_node(fraction_digits: int | None, length: int | None = None) -> tuple[Node, int | None]:
    """HH:MM:SS[.frac] and an offset, and its longest length (None: no end). Fractions have at most
    fraction_digits digits (None: any), and with `length` (the characters a maxLength leaves the time) at most
    what fits before each offset (Z: 1 character, +HH:MM: 6)."""
    def frac(offset: int) -> int | None:
        fit = None if length is None else length - 9 - offset
        return fit if fraction_digits is None else fraction_digits if fit is None else min(fraction_digits, fit)

    def point(most: int | None) -> Node:
        return opt(seq(lit(b"."), Repeat(DIGIT, 1, most))) if most is None or most > 0 else lit(b"")
    z, off = (None if m is None else max(m, 0) for m in (frac(1), frac(6)))
    zone, hours = bytes_of(b"Zz"), seq(bytes_of(b"+-"), _two(0, 23), lit(b":"), _two(0, 59))
    if z == off:
        tail = seq(point(z), alt(zone, hours))
    else:
        tail = alt(seq(point(z), zone), seq(point(off), hours))
    longest = None if z is None or off is None else max(9 + (z + 1 if z else 0), 14 + (off + 1 if off else 0))
    return seq(_two(0, 23), lit(b":"), _two(0, 59), lit(b":"), _two(0, 59), tail), longest


def uuid_node() -> Node:
    hexd = bytes_of(b"0123456789abcdefABCDEF")
    groups = [Repeat(hexd, n, n) for n in (8, 4, 4, 4, 12)]
    return seq(groups[0], lit(b"-"), groups[1], lit(b"-"), groups[2], lit(b"-"), groups[3], lit(b"-"), groups[4])


def format_node(name: str, fraction_digits: int | None, budget: int,
                length: int | None = None) -> tuple[Node, int, int | None] | None:
    """(node, min chars, max chars or None: no end) of a supported format, None for any other name; the
    network formats fit `budget` characters (ValueError when they cannot), times' fractions `length` (the
    string's maxLength, if any: see time_node)."""
    if name in _NET:
        return _NET[name](budget)
    if name == "date":
        return date_node(), 10, 10
    if name == "time":
        node, longest = time_node(fraction_digits, length)
        return node, 9, longest
    if name == "date-time":
        node, longest = time_node(fraction_digits, None if length is None else length - 11)
        return seq(date_node(), bytes_of(b"Tt"), node), 20, None if longest is None else longest + 11
    if name == "uuid":
        return uuid_node(), 36, 36
    return None


_NET = {"ipv4": lambda budget: ipv4_node(), "ipv6": lambda budget: ipv6_node(), "hostname": hostname_node,
        "email": email_node, "uri": uri_node, "uri-reference": uri_reference_node}
FORMATS = ("date", "time", "date-time", "uuid", *_NET)
# The formats JSON Schema 2020-12 defines: one outside FORMATS is refused (its values cannot be written exactly);
# a name it does not define (`path`, `topic`, `int32` on a string) is an annotation, as the specification reads it.
DEFINED_FORMATS = frozenset({"date-time", "date", "time", "duration", "email", "idn-email", "hostname",
                             "idn-hostname", "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid",
                             "uri-template", "json-pointer", "relative-json-pointer", "regex"})
__all__ = ["DEFINED_FORMATS", "FORMATS", "char_node", "complement", "date_node", "format_node", "must_escape",
           "normalize", "time_node", "uuid_node"]
