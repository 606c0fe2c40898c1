"""`pattern`: a regex subset compiled into JSON string body nodes.

The subset, read as jsonschema reads it (Python's `re.search`); where ECMA-262 reads a construct
otherwise it is refused, except `.`, which is Python's and llguidance's (ECMA-262 also excludes \r,
U+2028 and U+2029):
    literal characters; `.` (any character but newline); classes `[abc]`, `[a-z]`, `[^...]`;
    class escapes \\d \\w \\s \\D \\W \\S, in and out of classes, written as both Python's (Unicode) and
    ECMA-262's (ASCII) readings match them (schema/regex_classes.py: \\d writes [0-9], \\D and [^\\d] no
    Unicode digit); \\n \\t \\r \\f \\v, \\xHH, \\uHHHH (not a surrogate) and any escaped punctuation
    (\\. \\\\ \\/ \\- ...);
    groups (...) and (?:...); alternation |; quantifiers ? * + {m} {m,} {m,n}, lazy forms (same language);
    anchors: ^ only at the start of a top-level branch, $ only at its end.
Anything else (backreferences, lookaround, \\b, flags, possessive quantifiers) is refused.

The generated body always satisfies the pattern as `re.search` reads it. A branch without `$` may be followed
by up to `free_cap` arbitrary characters (under a `maxLength`, `bounded`: by as many as keep the value within
it), and its last quantified part is written at its minimum (re.search's reading: S{m,n} then anything is S{m}
then anything, without the ambiguity of where the repetition ends); a branch without `^` is generated as
though it had one (the value starts with the match: a free run before it could not be told from the match by
the string automaton);
`*`, `+` and `{m,}` repeat at most `repeat_cap` times (at least m); with `repeat_cap` None, without a cap (a loop;
an item that may be empty loops without the empty string: `(a?)*` is `a*`, `without_empty`). `free_cap` None: the
free characters are not counted either. A part's longest match is then `math.inf`. Each pattern character is one JSON
character, written as JsonStr writes it (schema_strings.char_node), so the body is valid JSON string content.

`search=True` reads a pattern the other way, for schema/overlap.py: a node holding *at least* every string
`re.search` finds a match in (up to the caps), never fewer: up to `free_cap` free characters before a branch
without `^` too, an optional newline after `$` (Python's `$` matches before a final one), and the class
escapes read wide (regex_classes.py: what either reading may match).
"""
from __future__ import annotations

import math

from ..grammar.nodes import Alt, JsonStr, Lit, Node, Repeat, Seq
from .base import LENGTH_CEILING
from .nodes import EMPTY, alt, node_accepts, seq
from .regex_classes import class_escape
from .strings import char_node, complement

_CHAR_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B}
_META = set(".^$*+?()[]{}|\\")


class PatternError(ValueError):
    """A pattern outside the subset; `offset` is where in the pattern."""

    def __init__(self, offset: int, message: str):
        super().__init__(f"at offset {offset}: {message}")
        self.offset = offset


Part = tuple[Node, int, int]            # node, min and max length in characters (max math.inf: no max)


class _Parser:
    def __init__(self, pattern: str, repeat_cap: int, free_cap: int, search: bool = False, bounded: bool = False):
        self.s, self.i, self.repeat_cap, self.free_cap, self.bounded = pattern, 0, repeat_cap, free_cap, bounded
        self.search, self.negated = search, False
        self.times = None                 # the minimum of the quantifier `quantified` read last (None: none)

    def peek(self) -> str | None:
        return self.s[self.i] if self.i < len(self.s) else None

    def fail(self, message: str, offset: int | None = None):
        raise PatternError(self.i if offset is None else offset, message)

    # --- structure ------------------------------------------------------------------------------
    def top(self) -> Part:
        branches = [self.branch(top=True)]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.branch(top=True))
        if self.peek() is not None:
            self.fail(f"unbalanced {self.peek()!r}")
        return _alt_parts(branches)

    def group_body(self) -> Part:
        branches = [self.branch(top=False)]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.branch(top=False))
        return _alt_parts(branches)

    def branch(self, top: bool) -> Part:
        end_anchor = start_anchor = False
        if top and self.peek() == "^":
            self.i += 1          # `^`: the value starts with the match, as it does without one (see the docstring)
            start_anchor = True
        parts: list[Part] = []
        last = None                                       # (atom, m) of the last part, if a quantifier made it
        while (c := self.peek()) is not None and c not in "|)":
            if c == "$" and top and (self.i + 1 == len(self.s) or self.s[self.i + 1] == "|"):
                end_anchor, self.i = True, self.i + 1
                break
            if c in "^$":
                self.fail(f"anchor {c!r} is supported only at the start (^) or end ($) of the pattern or of a "
                          "top-level branch")
            atom = self.atom()
            parts.append(self.quantified(atom))
            last = (atom, self.times) if self.times is not None else None
        if top and not end_anchor and not self.search and last is not None and parts[-1][2] > last[0][2] * last[1]:
            # re.search: a match that ends in S{m,n} may be followed by anything, so S{m} then the free run is the
            # same language, and one reading of it (where the repetition ends is not the automaton's to track)
            (node, lo, hi), m = last
            parts[-1] = (EMPTY if m == 0 else node if m == 1 else Repeat(node, m, m)), lo * m, hi * m
        node = seq(*(p[0] for p in parts)) if parts else EMPTY
        lo, hi = sum(p[1] for p in parts), sum(p[2] for p in parts)
        if top and not end_anchor:
            # Free characters may follow the match (re.search's reading): up to free_cap of them, or, under a
            # maxLength (bounded), as many as keep the value within it. None
            # precede it, even without `^`: a value body must end at its closing quote, so a free run could only
            # stand at the end; a value that starts with the match still satisfies the pattern.
            tail = max(0, self.free_cap - hi) if self.bounded and hi <= self.free_cap else self.free_cap
            node, hi = seq(node, JsonStr(0, tail)), hi + _most(tail)
        if top and self.search:
            if not start_anchor:
                node, hi = seq(JsonStr(0, self.free_cap), node), hi + _most(self.free_cap)
            if end_anchor:
                node, hi = seq(node, alt(EMPTY, char_node([(0x0A, 0x0A)]))), hi + 1
        return node, lo, hi

    def atom(self) -> Part:
        c, start = self.peek(), self.i
        if c == "(":
            self.i += 1
            if self.peek() == "?":
                if self.s[self.i:self.i + 2] != "?:":
                    self.fail("only (?:...) groups are supported (no lookaround, named groups or flags)")
                self.i += 2
            body = self.group_body()
            if self.peek() != ")":
                self.fail("missing ')'", start)
            self.i += 1
            return body
        if c == "[":
            return self.chars(self.char_class())
        if c == ".":
            self.i += 1
            return self.chars(complement([(0x0A, 0x0A)]))
        if c == "\\":
            return self.chars(self.escape(in_class=False))
        if c in "*+?{":
            self.fail(f"nothing to repeat before {c!r} (write \\{c} for the character)")
        self.i += 1
        return self.chars([(ord(c), ord(c))])

    def chars(self, ranges) -> Part:
        node = char_node(ranges)
        if node is None:
            self.fail("a character class that matches no character")
        return node, 1, 1

    def quantified(self, part: Part) -> Part:
        """`part` under the quantifier that follows, if any (self.times: its minimum, else None)."""
        c, start = self.peek(), self.i
        self.times = None
        if c is None or c not in "*+?{":
            return part
        self.i += 1
        if c == "*":
            m, n = 0, self.repeat_cap
        elif c == "+":
            m, n = 1, self.repeat_cap
        elif c == "?":
            m, n = 0, 1
        else:
            close = self.s.find("}", self.i)
            body = self.s[self.i:close] if close >= 0 else ""
            lo_s, comma, hi_s = body.partition(",")
            digits = lo_s.isascii() and lo_s.isdigit() and (not hi_s or (hi_s.isascii() and hi_s.isdigit()))
            if close < 0 or not digits:
                self.fail("'{' must start a quantifier {m}, {m,} or {m,n} (write \\{ for the character)", start)
            self.i = close + 1
            m = int(lo_s)
            n = int(hi_s) if hi_s else (m if not comma else None if self.repeat_cap is None else
                                        max(m, self.repeat_cap))
            if n is not None and n < m:
                self.fail(f"quantifier {{{body}}} has max < min", start)
        if self.peek() == "?":
            self.i += 1                     # lazy: the same language
        elif self.peek() == "+":
            self.fail("possessive quantifiers are not supported")
        if self.peek() is not None and self.peek() in "*+{":
            self.fail("a quantifier cannot follow a quantifier")
        node, lo, hi = part
        self.times = m
        if n == 0:
            return EMPTY, 0, 0
        if lo * m > LENGTH_CEILING:
            self.fail(f"a match needs at least {lo * m} characters, above the supported maximum {LENGTH_CEILING}",
                      start)
        if n is None and lo == 0:
            # a loop needs an item that is never empty: X{m,} of an X that may be empty is (X without the
            # empty string)* (drop the empty repetitions; pad with them up to m)
            node = without_empty(node)
            return (EMPTY, 0, 0) if node is None else (Repeat(node, 0, None), 0, math.inf)
        if n is None:
            return Repeat(node, m, None), lo * m, math.inf
        if hi * n > LENGTH_CEILING and hi != math.inf:   # fewer repetitions: every match still matches; 10^8 of
            n = max(m, LENGTH_CEILING // max(hi, 1))      # them cannot be held
        return (node if (m, n) == (1, 1) else Repeat(node, m, n)), lo * m, hi * n

    # --- characters -----------------------------------------------------------------------------
    def escape(self, in_class: bool) -> list[tuple[int, int]]:
        start = self.i
        self.i += 1
        c = self.peek()
        if c is None:
            self.fail("pattern ends with a lone backslash", start)
        self.i += 1
        if c in "dwsDWS":
            # what we write takes the narrow set; a superset (search) the wide one; a negated class the other
            return class_escape(c, wide=self.search != self.negated)
        if c in _CHAR_ESCAPES:
            cp = _CHAR_ESCAPES[c]
            return [(cp, cp)]
        if c in "xu":
            width = 2 if c == "x" else 4
            digits = self.s[self.i:self.i + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                self.fail(f"\\{c} needs {width} hex digits", start)
            self.i += width
            cp = int(digits, 16)
            if 0xD800 <= cp <= 0xDFFF:              # Python's re and ECMA-262 read surrogate escapes apart
                self.fail(f"\\{c}{digits} is a surrogate; write the character itself", start)
            return [(cp, cp)]
        if c.isascii() and not c.isalnum():
            return [(ord(c), ord(c))]
        self.fail(f"escape \\{c} is not supported")

    def char_class(self) -> list[tuple[int, int]]:
        start = self.i
        self.i += 1
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        self.negated = negate          # its items are complemented: class_escape reads them the other way
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.peek()
            if c is None:
                self.fail("missing ']'", start)
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            item = self.class_item()
            if self.peek() == "-" and self.i + 1 < len(self.s) and self.s[self.i + 1] != "]":
                self.i += 1
                dash = self.i
                other = self.class_item()
                if len(item) != 1 or len(other) != 1 or item[0][0] != item[0][1] or other[0][0] != other[0][1]:
                    self.fail("a range in a class needs single characters at both ends", dash)
                if other[0][0] < item[0][0]:
                    self.fail("a range in a class runs backwards", dash)
                item = [(item[0][0], other[0][0])]
            ranges.extend(item)
        self.negated = False
        return complement(ranges) if negate else ranges

    def class_item(self) -> list[tuple[int, int]]:
        c = self.peek()
        if c == "\\":
            return self.escape(in_class=True)
        self.i += 1
        return [(ord(c), ord(c))]


def without_empty(node: Node) -> Node | None:
    """The language of `node` without the empty string (None if that leaves nothing), written with the same
    nodes: a loop of the result never runs on empty input. Sizes: a Seq may be written twice over its nullable
    prefix (a pattern's groups are small)."""
    if not node_accepts(node, b""):
        return node
    if isinstance(node, Lit):                          # the empty Lit
        return None
    if isinstance(node, JsonStr):
        return None if node.max == 0 else JsonStr(max(node.min, 1), node.max)
    if isinstance(node, Alt):
        rest = [x for x in map(without_empty, node.options) if x is not None]
        return alt(*rest) if rest else None
    if isinstance(node, Seq):                          # (a b)\e = (a\e) b | b\e (a and b both nullable here)
        head, tail = without_empty(node.items[0]), seq(*node.items[1:])
        options = [x for x in (None if head is None else seq(head, tail), without_empty(tail)) if x is not None]
        return alt(*options) if options else None
    if isinstance(node, Repeat):                       # X{m,n} nullable: (X\e){1,n}
        item = without_empty(node.item)
        if item is None or node.max == 0:
            return None
        return Repeat(item, 1, node.max) if (node.max is None or node.max > 1) else item
    raise TypeError(f"without_empty: no rule for {type(node).__name__}")


def _most(cap: int | None):
    """The longest a JsonStr of this max adds (None: no max)."""
    return math.inf if cap is None else cap


def _alt_parts(parts: list[Part]) -> Part:
    if len(parts) == 1:
        return parts[0]
    return alt(*(p[0] for p in parts)), min(p[1] for p in parts), max(p[2] for p in parts)


def pattern_node(pattern: str, repeat_cap: int, free_cap: int, search: bool = False, bounded: bool = False) -> Part:
    """(node, min chars, max chars) for `pattern` (module docstring); PatternError outside the subset. `bounded`:
    free_cap is the string's own maxLength (the whole value stays within it)."""
    return _Parser(pattern, repeat_cap, free_cap, search, bounded).top()
