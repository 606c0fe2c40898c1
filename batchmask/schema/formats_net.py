"""Network formats: ipv4 (exact), hostname, email and uri (narrowed: a practical subset, every member valid).

    ipv4      four decimal octets 0-255 without leading zeros, as Python's ipaddress reads them: exact
    ipv6      eight groups of 1-4 hex digits, one "::", an ipv4 tail, as Python's ipaddress reads them: exact
    hostname  1-4 dot-separated labels (up to LABEL_CAP characters) of letters, digits and inner hyphens;
              the last starts with a letter
    email     local part: dot-separated atoms of RFC 5322 atext; '@'; a hostname of 2-4 labels
    uri       http or https '://' a hostname or an ipv4 address, an optional port 1-65535, '/'-segments of
              RFC 3986 pchars (percent escapes included), an optional ?query and #fragment
    uri-reference  a uri, or a relative reference without an authority (a path, ?query, #fragment; or empty)

The narrowed formats fit a length budget (maxLength, or SchemaOptions.max_string_length without one):
each part's repetitions are capped so that the longest member is within it. Every member is valid for
jsonschema's format checker (fqdn, rfc3986-validator; its email check only asks for an '@').
"""
from __future__ import annotations

from ..grammar.nodes import Node, Repeat, Word
from .nodes import alt, bytes_of, lit, opt, seq
from .numbers import nat_range

_ALNUM = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_LETTER, _DIGIT = _ALNUM[:52], _ALNUM[52:]
_ATEXT = _ALNUM + b"!#$%&'*+/=?^_`{|}~-"
_UNRESERVED = _ALNUM + b"-._~"
_PCHAR = _UNRESERVED + b"!$&'()*+,;=:@"           # RFC 3986 pchar, but for pct-encoded (added below)
_HEX = b"0123456789abcdefABCDEF"
# Labels and atoms are Words (value blocks: their positions share table rows), written so that no two run side
# by side (_host); the uri's path, query and fragment characters (with percent escapes) are one automaton state
# each, and each costs the table builder work over the tokens its byte set lets through, so the parts are kept
# short (RFC 1035 allows 63).
LABEL_CAP = 16          # characters per hostname label
MAX_LABELS = 4          # labels per hostname
ATOM_CAP = 10           # characters per email local-part atom
SEGMENTS = 4            # uri path segments


def ipv4_node() -> tuple[Node, int, int]:
    octet = nat_range(0, 255)
    return seq(octet, lit(b"."), octet, lit(b"."), octet, lit(b"."), octet), 7, 15


def ipv6_node() -> tuple[Node, int, int]:
    """RFC 4291's text form as Python's ipaddress reads it (jsonschema's checker): eight groups of 1-4 hex digits,
    one "::" for a run of zero groups, the last two groups as an ipv4 address if wanted; no zone. Exact."""
    h16 = Repeat(bytes_of(_HEX), 1, 4)
    ls32 = alt(seq(h16, lit(b":"), h16), ipv4_node()[0])

    def groups(n: int, last: Node | None) -> Node:
        """n groups, each followed by ':', then `last` (None: n groups separated by ':', no trailing ':')."""
        if last is None:
            return lit(b"") if n == 0 else seq(h16, *(seq(lit(b":"), h16) for _ in range(n - 1)))
        return seq(*([seq(h16, lit(b":")) for _ in range(n)] + [last]))

    def upto(k: int) -> Node:
        """0..k groups separated by ':' (before a '::')."""
        return alt(*(groups(n, None) for n in range(k + 1)))
    forms = [groups(6, ls32)]
    for after in range(5, -1, -1):                        # '::' then `after` groups and ls32: 7 - after at most before
        forms.append(seq(upto(5 - after), lit(b"::"), groups(after, ls32)))
    forms.append(seq(upto(6), lit(b"::"), h16))           # '::' then one group
    forms.append(seq(upto(7), lit(b"::")))                # '::' last
    return alt(*forms), 2, 45


def _label(first: bytes, longest: int) -> Node:
    """A DNS label of 1..longest characters: `first` first, letters/digits/inner hyphens after (a Word:
    compiled as a value, its positions share table rows)."""
    return Word(_mask(first), _mask(_ALNUM + b"-"), _mask(_ALNUM), 1, longest)


def _mask(allowed: bytes) -> bytes:
    return bytes(bytes_of(allowed).mask)


def _host(budget: int, min_labels: int) -> tuple[Node, int, int]:
    """Hostnames of min_labels..MAX_LABELS labels, the last starting with a letter, the whole within `budget`
    and 253 characters (RFC 1035, fqdn).

    Written so that a label's first byte says which label it is: one starting with a digit is not the last,
    one starting with a letter may be (then '.' goes on). Written as "labels, then a letter-first label", two
    labels would run side by side at every position of every label but the last (which one it is shows only
    at its end), each position an automaton state that thousands of tokens leave: ~10x the compile."""
    longest = min(LABEL_CAP, (budget + 1) // 4 - 1)
    if longest < 1:
        raise ValueError("the length budget is too small")
    digit_first, letter_first = _label(_DIGIT, longest), _label(_LETTER, longest)

    def labels(need: int, room: int) -> Node:
        """need..room more labels (need >= 1), the last one letter-first."""
        more = seq(lit(b"."), labels(max(need - 1, 1), room - 1)) if room > 1 else None
        after_letter = [x for x in ((lit(b"") if need <= 1 else None), more) if x is not None]
        options = [seq(letter_first, alt(*after_letter))]
        if more is not None:
            options.append(seq(digit_first, more))
        return alt(*options)

    return labels(min_labels, MAX_LABELS), 2 * min_labels - 1, MAX_LABELS * (longest + 1) - 1


def hostname_node(budget: int) -> tuple[Node, int, int]:
    return _host(budget, 1)


def email_node(budget: int) -> tuple[Node, int, int]:
    local_budget = min(64, max(1, (budget - 1) // 3))
    atom_len = min(ATOM_CAP, max(1, (local_budget + 1) // 3 - 1))
    atom = Word(_mask(_ATEXT), _mask(_ATEXT), _mask(_ATEXT), 1, atom_len)
    local = seq(atom, Repeat(seq(lit(b"."), atom), 0, 2))
    domain, dlo, dhi = _host(budget - 1 - (3 * atom_len + 2), 2)        # 3 atoms and 2 dots at most
    return seq(local, lit(b"@"), domain), 2 + dlo, 3 * atom_len + 2 + 1 + dhi


def uri_node(budget: int) -> tuple[Node, int, int]:
    fixed = len("https://") + len(":65535")
    room = budget - fixed
    if room < 15:
        raise ValueError("the length budget is too small")
    host, hlo, hhi = _host(max(15, room * 2 // 5), 1)
    hhi = max(hhi, 15)                                            # an ipv4 address is up to 15
    rest = room - hhi                                             # half for the path, a quarter each after
    segs = SEGMENTS
    seg_len = min(LABEL_CAP, (rest // 2 // segs - 1) // 3)       # a pct escape is 3 characters
    tail_len = min(2 * LABEL_CAP, (rest // 4 - 1) // 3)
    pct = seq(lit(b"%"), bytes_of(_HEX), bytes_of(_HEX))
    pchar, qchar = alt(bytes_of(_PCHAR), pct), alt(bytes_of(_PCHAR + b"/?"), pct)
    parts = [lit(b"http"), opt(lit(b"s")), lit(b"://"), alt(host, ipv4_node()[0]),
             opt(seq(lit(b":"), nat_range(1, 65535)))]
    longest = fixed + hhi
    if seg_len > 0:
        parts.append(Repeat(seq(lit(b"/"), Repeat(pchar, 0, seg_len)), 0, segs))
        longest += segs * (1 + 3 * seg_len)
    if tail_len > 0:
        parts += [opt(seq(lit(b"?"), Repeat(qchar, 0, tail_len))), opt(seq(lit(b"#"), Repeat(qchar, 0, tail_len)))]
        longest += 2 * (1 + 3 * tail_len)
    return seq(*parts), len("http://") + hlo, longest


def uri_reference_node(budget: int) -> tuple[Node, int, int]:
    """A uri (uri_node) or a relative reference without an authority: an absolute path ('/' and segments), a
    relative one (its first segment without ':', so it reads as no scheme) or none, then ?query and #fragment;
    the empty string too. The parts are capped as uri_node caps them, so the longest fits `budget`."""
    absolute, _, longest = uri_node(budget)
    seg_len = min(LABEL_CAP, max(1, (budget // 2 // SEGMENTS - 1) // 3))
    tail_len = min(2 * LABEL_CAP, max(0, (budget // 4 - 1) // 3))
    pct = seq(lit(b"%"), bytes_of(_HEX), bytes_of(_HEX))
    pchar, first = alt(bytes_of(_PCHAR), pct), alt(bytes_of(_PCHAR.replace(b":", b"")), pct)
    qchar = alt(bytes_of(_PCHAR + b"/?"), pct)
    more = Repeat(seq(lit(b"/"), Repeat(pchar, 0, seg_len)), 0, SEGMENTS - 1)
    path = alt(seq(lit(b"/"), opt(seq(Repeat(pchar, 1, seg_len), more))), seq(Repeat(first, 1, seg_len), more),
               lit(b""))
    tails = [opt(seq(lit(mark), Repeat(qchar, 0, tail_len))) for mark in (b"?", b"#")] if tail_len else []
    relative = seq(path, *tails)
    rel_longest = SEGMENTS * (1 + 3 * seg_len) + (2 * (1 + 3 * tail_len) if tail_len else 0)
    return alt(absolute, relative), 0, max(longest, rel_longest)
