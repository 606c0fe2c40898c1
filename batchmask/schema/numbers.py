"""Integer and number nodes: exact ranges as digit automata.

A range of integers written in decimal without leading zeros is a regular language: split it by
digit count, and each fixed-width range by its first differing digit (`lex_range`). A side the
schema leaves open is a loop: naturals from lo are lo's own digit count (a fixed-width range) or
any longer string, `[1-9][0-9]{d,}`. Bounds are exact Fractions (JSON floats are read as the
decimal they were written as, so every bound is a finite decimal).

Numbers with a bound are written without an exponent, as a sign, an integer part I and an
optional fraction F: the value I.F lies within lo..hi iff I lies strictly between the bounds'
integer parts (any fraction), or I is a bound's integer part and F compares with that bound's
fraction digits as the bound asks (`_fraction`: digit by digit, any digits once one differs).
Trailing zeros are allowed (`1.50`). Without any bound a number is JSON's number syntax.

Caps (SchemaOptions; None by default, no cap): int_digits bounds an open side at 10^int_digits
(exclusive); fraction_digits bounds F's length; exponent_digits the exponent of a number without
any bound.

Minus zero (JSON allows it; jsonschema reads it as 0), as llguidance writes it: an integer schema with
both bounds or neither admits "-0" when its range holds 0 and a negative value; one with a single bound
never does; bounded numbers never write "-0", "-0.0", ...; unbounded numbers follow JSON's syntax.
"""
from __future__ import annotations

from fractions import Fraction
from math import ceil, floor

from ..grammar.nodes import Node, Repeat
from .nodes import DIGIT, EMPTY, alt, byte_range, bytes_of, lex_range, lit, opt, seq

Bound = tuple[Fraction, bool]          # (value, exclusive)
NONZERO = byte_range(0x31, 0x39)
ZERO = bytes_of(b"0")


def _fixed(lo: int, hi: int, width: int) -> Node:
    """Every width-digit string (leading zeros included) of a value in lo..hi."""
    return lex_range(str(lo).zfill(width).encode(), str(hi).zfill(width).encode(), 0x30, 0x39)


def nat_range(lo: int, hi: int | None) -> Node | None:
    """Naturals lo..hi (0 <= lo; hi None: no end) in decimal without leading zeros; None when empty."""
    if hi is None:
        d = len(str(lo))
        if lo <= 1 or lo == 10 ** (d - 1):                # every value of d digits or more (and 0)
            tail = seq(NONZERO, Repeat(DIGIT, max(d - 1, 0), None))
            return alt(lit(b"0"), tail) if lo == 0 else tail
        return alt(nat_range(lo, 10 ** d - 1), seq(NONZERO, Repeat(DIGIT, d, None)))
    if lo > hi:
        return None
    parts, full = [], []                 # full: digit counts d >= 2 whose every value is in range
    for d in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (d - 1) if d > 1 else 0)
        b = min(hi, 10 ** d - 1)
        if d >= 2 and a == 10 ** (d - 1) and b == 10 ** d - 1:
            full.append(d)
        elif a <= b:
            parts.append(_fixed(a, b, d))
    if full:                             # consecutive by construction: one run of "any d digits"
        parts.insert(1 if lo < 10 ** (full[0] - 1) else 0,
                     seq(NONZERO, Repeat(DIGIT, full[0] - 1, full[-1] - 1)))
    return alt(*parts)


def int_range(lo: int | None, hi: int | None, minus_zero: bool = True) -> Node | None:
    """Integers lo..hi (None: that side open); with minus_zero, "-0" too when lo < 0 <= hi (see the module
    docstring). None when the range is empty."""
    if lo is not None and hi is not None and lo > hi:
        return None
    parts = []
    if lo is None or lo < 0:
        neg = nat_range(1 if hi is None else max(1, -hi), None if lo is None else -lo)
        zero = (hi is None or hi >= 0) and minus_zero
        parts.append(seq(lit(b"-"), alt(neg, lit(b"0")) if zero else neg))
    if hi is None or hi >= 0:
        parts.append(nat_range(0 if lo is None else max(0, lo), hi))
    return alt(*parts)


def _int_bounds(low: Bound | None, high: Bound | None, int_digits: int | None) -> tuple[int | None, int | None]:
    """The least and greatest integers within the bounds (None: open; with int_digits, +-(10^int_digits - 1))."""
    a = None if low is None else floor(low[0]) + 1 if low[1] else ceil(low[0])
    b = None if high is None else ceil(high[0]) - 1 if high[1] else floor(high[0])
    if int_digits is not None:
        a = -(10 ** int_digits - 1) if a is None else a
        b = 10 ** int_digits - 1 if b is None else b
    return a, b


def integer_node(low: Bound | None, high: Bound | None, int_digits: int | None = None) -> Node | None:
    """Integers within the bounds; an absent side is open, or reaches int_digits digits. None when empty."""
    a, b = _int_bounds(low, high, int_digits)
    return int_range(a, b, minus_zero=(low is None) == (high is None))


# --- integer multipleOf ------------------------------------------------------------------------------
MULTIPLES_LISTED = 256   # a bounded range of at most this many multiples is written as their literals


def integer_step(k: Fraction) -> int:
    """multipleOf k (> 0) on integers: an integer v is a multiple of p/q (lowest terms) iff p divides v."""
    return k.numerator


def multiples_node(low: Bound | None, high: Bound | None, step: int,
                   int_digits: int | None = None) -> tuple[bool, Node | None]:
    """(whether it can be written exactly, the integers within the bounds that `step` divides, None when none).
    Written exactly: step 1 (every integer); at most MULTIPLES_LISTED multiples between two bounds (their
    literals); a step 10^m (the integer y of y * 10^m in its own range, then m zeros). Otherwise (False, None):
    the schema's mode decides (lenient writes the integers without the step). int_digits: as integer_node."""
    if step == 1:
        return True, integer_node(low, high, int_digits)
    a, b = _int_bounds(low, high, int_digits)
    first = None if a is None else -(-a // step) * step
    last = None if b is None else (b // step) * step
    if first is not None and last is not None:
        if first > last:
            return True, None
        if (last - first) // step + 1 <= MULTIPLES_LISTED:
            return True, alt(*(lit(str(v).encode()) for v in range(first, last + 1, step)))
    zeros = len(str(step)) - 1
    if step != 10 ** zeros:
        return False, None
    ya = None if first is None else first // step
    yb = None if last is None else last // step
    parts = []
    if ya is None or ya < 0:                               # y < 0: "-" y's digits, then the zeros
        parts.append(seq(int_range(ya, -1 if yb is None else min(yb, -1), minus_zero=False), lit(b"0" * zeros)))
    if (ya is None or ya <= 0) and (yb is None or yb >= 0):
        parts.append(lit(b"0"))
    if yb is None or yb > 0:
        parts.append(seq(int_range(1 if ya is None else max(ya, 1), yb), lit(b"0" * zeros)))
    return True, alt(*parts)


def number_multiples(low: Bound | None, high: Bound | None, k: Fraction, int_digits: int | None = None,
                     fraction_digits: int | None = None) -> tuple[bool, Node | None]:
    """multipleOf k (> 0) on a number: (whether it can be written exactly, the node; None when no multiple lies
    within the bounds). An integer k: the multiples are integers, written as multiples_node writes them;
    k = 10^-m: exactly the numbers of at most m fraction digits (number_node with that room, no exponent). Other
    steps: (False, None). As for integers, each value has one spelling family, not every one: "2.5" and "2.50"
    for a step of 0.01, not "2.500" nor "25e-1"."""
    if k.denominator == 1:
        return multiples_node(low, high, k.numerator, int_digits)
    m = len(str(k.denominator)) - 1
    if k.numerator != 1 or k.denominator != 10 ** m:
        return False, None
    room = m if fraction_digits is None else min(m, fraction_digits)
    return True, number_node(low, high, int_digits, room, exponent_digits=0)        # bounded numbers have none


# --- numbers with a bound ---------------------------------------------------------------------------
def _split(x: Fraction) -> tuple[int, str]:
    """A nonnegative finite decimal as (integer part, fraction digits without trailing zeros)."""
    d, twos, fives = x.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d != 1:
        raise ValueError(f"bound {x} is not a finite decimal")
    k = max(twos, fives)
    whole, frac = divmod(x.numerator * 10 ** k // x.denominator, 10 ** k)
    return whole, (str(frac).zfill(k) if k else "").rstrip("0")


def _fraction(a: str | None, a_ex: bool, b: str | None, b_ex: bool, room: int | None,
              nonempty: bool) -> Node | None:
    """Digit strings F (at most `room` long, None: any; at least one digit if `nonempty`) with 0.a < 0.F
    (a_ex; else <=) and 0.F < 0.b (b_ex; else <=). a, b: fraction digits without trailing zeros ("" is 0),
    0.a <= 0.b; None: no bound on that side. None when no string fits."""
    if a == "" and not a_ex:
        a = None                                          # 0.F >= 0 always
    least = 1 if nonempty else 0
    if room is not None and room < least:
        return None
    if b == "":                                           # 0.F <= 0: zeros only
        return None if b_ex or a is not None else Repeat(ZERO, least, room)
    if a is None and b is None:
        return Repeat(DIGIT, least, room)
    if a == "" and b is None and room is None:            # 0.F > 0: some digit not 0
        return seq(Repeat(ZERO, 0, None), NONZERO, Repeat(DIGIT, 0, None))
    parts = [EMPTY] if not nonempty and a is None else []  # F empty: 0, above no lower bound here
    if room == 0:
        return alt(*parts) if parts else None
    rest = None if room is None else room - 1
    a1 = int(a[0]) if a else 0
    b1 = int(b[0]) if b is not None else 9
    if a is not None and b is not None and a1 == b1:
        parts.append(_then(a1, _fraction(a[1:], a_ex, b[1:], b_ex, rest, False)))
    else:
        if a is not None:
            parts.append(_then(a1, _fraction(a[1:], a_ex, None, False, rest, False)))
        free_lo, free_hi = a1 + 1 if a is not None else 0, b1 - 1 if b is not None else 9
        if free_lo <= free_hi:
            parts.append(seq(byte_range(0x30 + free_lo, 0x30 + free_hi), Repeat(DIGIT, 0, rest)))
        if b is not None:
            parts.append(_then(b1, _fraction(None, False, b[1:], b_ex, rest, False)))
    parts = [p for p in parts if p is not None]
    return alt(*parts) if parts else None


def _then(digit: int, rest: Node | None) -> Node | None:
    return None if rest is None else seq(lit(str(digit)), rest)


def _point(a: str | None, a_ex: bool, b: str | None, b_ex: bool, room: int | None) -> Node | None:
    """Nothing (the fraction 0) or "." and a nonempty fraction F, as `_fraction` compares it."""
    zero = (a is None or (a == "" and not a_ex)) and not (b == "" and b_ex)
    f = _fraction(a, a_ex, b, b_ex, room, True)
    parts = ([EMPTY] if zero else []) + ([seq(lit(b"."), f)] if f is not None else [])
    return alt(*parts) if parts else None


def _magnitude(lo: Bound, hi: Bound | None, room: int | None) -> Node | None:
    """Nonnegative decimals I[.F] (I without leading zeros, F at most `room` digits) within lo..hi."""
    if hi is not None and (lo[0] > hi[0] or (lo[0] == hi[0] and (lo[1] or hi[1]))):
        return None
    li, lf = _split(lo[0])
    hi_i, hf = _split(hi[0]) if hi is not None else (None, None)
    if li == hi_i:
        parts = [_then(li, _point(lf, lo[1], hf, hi[1], room))]
    else:
        middle = nat_range(li + 1, None if hi is None else hi_i - 1)
        parts = [_then(li, _point(lf, lo[1], None, False, room)),
                 None if middle is None else seq(middle, _point(None, False, None, False, room)),
                 None if hi is None else _then(hi_i, _point(None, False, hf, hi[1], room))]
    parts = [p for p in parts if p is not None]
    return alt(*parts) if parts else None


def number_node(low: Bound | None, high: Bound | None, int_digits: int | None = None,
                fraction_digits: int | None = None, exponent_digits: int | None = None) -> Node | None:
    """Numbers within the bounds (module docstring); JSON's number syntax when there is no bound."""
    if low is None and high is None:
        int_part = alt(lit(b"0"), seq(NONZERO, Repeat(DIGIT, 0, None if int_digits is None else int_digits - 1)))
        frac = opt(seq(lit(b"."), Repeat(DIGIT, 1, fraction_digits))) if fraction_digits != 0 else EMPTY
        exp = EMPTY
        if exponent_digits != 0:
            exp = opt(seq(bytes_of(b"eE"), opt(bytes_of(b"+-")), Repeat(DIGIT, 1, exponent_digits)))
        return seq(opt(lit(b"-")), int_part, frac, exp)
    if int_digits is not None:                            # an open side reaches int_digits integer digits
        cap = Fraction(10 ** int_digits)
        low = (-cap, True) if low is None else low
        high = (cap, True) if high is None else high
    zero = Fraction(0)
    parts = []
    if low is None or low[0] < 0:                         # "-" and a magnitude above 0 (never "-0")
        m_lo = (-high[0], high[1]) if high is not None and high[0] < 0 else (zero, True)
        neg = _magnitude(m_lo, None if low is None else (-low[0], low[1]), fraction_digits)
        if neg is not None:
            parts.append(seq(lit(b"-"), neg))
    if high is None or high[0] >= 0:
        pos = _magnitude(low if low is not None and low[0] >= 0 else (zero, False), high, fraction_digits)
        if pos is not None:
            parts.append(pos)
    return alt(*parts) if parts else None
