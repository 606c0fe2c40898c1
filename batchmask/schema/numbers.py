"""Integer and number nodes: exact ranges as digit automata.

A range of integers written in decimal without leading zeros is a regular language: split it by
digit count, and each fixed-width range by its first differing digit (`lex_range`). Bounds are
exact Fractions (JSON floats are binary, compared exactly, as jsonschema compares them).

Numbers with a bound are written without an exponent: a value with k fraction digits is an
integer N = value * 10^k, so "lo <= value <= hi" is "ceil(lo * 10^k) <= N <= floor(hi * 10^k)", a
range of integers rendered with a point k digits from the right; the language is the union over
k = 0 .. fraction_digits. Without any bound a number is JSON's number syntax within the caps.

Minus zero (JSON allows it; jsonschema reads it as 0), as llguidance writes it: an integer schema with
both bounds or neither admits "-0" when its range holds 0 and a negative value; one with a single bound
never does; bounded numbers never write "-0", "-0.0", ...; unbounded numbers follow JSON's syntax.
"""
from __future__ import annotations

from fractions import Fraction
from math import ceil, floor

from ..grammar.nodes import Node, Repeat
from .nodes import DIGIT, alt, byte_range, bytes_of, lex_range, lit, opt, seq

Bound = tuple[Fraction, bool]          # (value, exclusive)


def _fixed(lo: int, hi: int, width: int) -> Node:
    """Every width-digit string (leading zeros included) of a value in lo..hi."""
    return lex_range(str(lo).zfill(width).encode(), str(hi).zfill(width).encode(), 0x30, 0x39)


def nat_range(lo: int, hi: int) -> Node | None:
    """Naturals lo..hi (0 <= lo) in decimal without leading zeros; None when the range is empty."""
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
                     seq(byte_range(0x31, 0x39), Repeat(DIGIT, full[0] - 1, full[-1] - 1)))
    return alt(*parts)


def int_range(lo: int, hi: int, minus_zero: bool = True) -> Node | None:
    """Integers lo..hi; with minus_zero, "-0" too when lo < 0 <= hi (see the module docstring)."""
    if lo > hi:
        return None
    parts = []
    if lo < 0:
        neg = nat_range(max(1, -hi), -lo)
        parts.append(seq(lit(b"-"), alt(neg, lit(b"0")) if hi >= 0 and minus_zero else neg))
    if hi >= 0:
        parts.append(nat_range(max(0, lo), hi))
    return alt(*parts)


def _point_range(lo: int, hi: int, k: int) -> Node | None:
    """Magnitudes N in lo..hi (0 <= lo) written as N / 10^k with exactly k fraction digits."""
    if lo > hi:
        return None
    if k == 0:
        return nat_range(lo, hi)
    s = 10 ** k
    (ia, fa), (ib, fb) = divmod(lo, s), divmod(hi, s)
    if ia == ib:
        return seq(lit(f"{ia}."), _fixed(fa, fb, k))
    parts = []
    mid_lo, mid_hi = ia + 1, ib - 1
    if fa == 0:
        mid_lo = ia
    else:
        parts.append(seq(lit(f"{ia}."), _fixed(fa, s - 1, k)))
    if fb == s - 1:
        mid_hi = ib
    middle = nat_range(mid_lo, mid_hi)
    if middle is not None:
        parts.append(seq(middle, lit(b"."), Repeat(DIGIT, k, k)))
    if fb != s - 1:
        parts.append(seq(lit(f"{ib}."), _fixed(0, fb, k)))
    return alt(*parts)


def _scaled_bounds(low: Bound | None, high: Bound | None, k: int, int_digits: int) -> tuple[int, int]:
    """The N range (value * 10^k) for k fraction digits; an absent side is capped at int_digits."""
    s = 10 ** k
    cap = 10 ** (int_digits + k) - 1
    if low is None:
        a = -cap
    else:
        v = low[0] * s
        a = floor(v) + 1 if low[1] else ceil(v)
    if high is None:
        b = cap
    else:
        v = high[0] * s
        b = ceil(v) - 1 if high[1] else floor(v)
    return a, b


def integer_node(low: Bound | None, high: Bound | None, int_digits: int) -> Node | None:
    """Integers within the bounds; an absent side reaches int_digits digits. None when empty."""
    a, b = _scaled_bounds(low, high, 0, int_digits)
    return int_range(a, b, minus_zero=(low is None) == (high is None))


def number_node(low: Bound | None, high: Bound | None, int_digits: int, fraction_digits: int,
                exponent_digits: int) -> Node | None:
    """Numbers within the bounds (module docstring); JSON's number syntax when there is no bound."""
    if low is None and high is None:
        int_part = alt(lit(b"0"), seq(byte_range(0x31, 0x39), Repeat(DIGIT, 0, int_digits - 1)))
        frac = opt(seq(lit(b"."), Repeat(DIGIT, 1, fraction_digits))) if fraction_digits > 0 else lit(b"")
        exp = lit(b"")
        if exponent_digits > 0:
            exp = opt(seq(bytes_of(b"eE"), opt(bytes_of(b"+-")), Repeat(DIGIT, 1, exponent_digits)))
        return seq(opt(lit(b"-")), int_part, frac, exp)
    parts = []
    for k in range(fraction_digits + 1):
        a, b = _scaled_bounds(low, high, k, int_digits)
        if a < 0:
            neg = _point_range(max(1, -b), -a, k)
            if neg is not None:
                parts.append(seq(lit(b"-"), neg))
        if b >= 0:
            pos = _point_range(max(0, a), b, k)
            if pos is not None:
                parts.append(pos)
    return alt(*parts) if parts else None
