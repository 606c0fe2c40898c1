"""Numbers without a digit cap (issue 24): open sides are loops, and ranges stay exact at any length.

The compiled automaton (`build_node_automaton`, walked byte by byte) is checked against references written
apart from batchmask: Python's exact arithmetic (int, Fraction) and jsonschema on the value, and llguidance on
the text. Values reach 40 digits on either side of the point, far past the old caps (15 integer digits,
6 fraction digits, 2 exponent digits); bounds reach 35 digits.
"""
from __future__ import annotations

import json
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import cache

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_schema import ranged

from batchmask.automaton.tree import build_node_automaton
from batchmask.schema.build import SchemaOptions, schema_node

V = jsonschema.Draft202012Validator
FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def _dfa(schema_text: str, options: SchemaOptions):
    aut = build_node_automaton(schema_node(json.loads(schema_text), options))
    assert not aut.blocks                                 # numbers are explicit states only
    step = {(int(s), int(b)): int(d) for s, b, d in aut.edges.tolist()}
    return aut.start, step, frozenset(aut.accepting.tolist()), aut.num_states


def accepts(schema: dict, text: str, options: SchemaOptions | None = None) -> bool:
    """Whether the compiled automaton of `schema` takes the whole of `text`."""
    state, step, final, _ = _dfa(json.dumps(schema, sort_keys=True), options or SchemaOptions())
    for b in text.encode():
        state = step.get((state, b))
        if state is None:
            return False
    return state in final


def within(v: Fraction, lo, lo_ex: bool, hi, hi_ex: bool) -> bool:
    """Python's arithmetic: lo < v (or <=) and v < hi (or <=), a bound read as the decimal it is written as."""
    lo = None if lo is None else Fraction(repr(lo)) if isinstance(lo, float) else Fraction(lo)
    hi = None if hi is None else Fraction(repr(hi)) if isinstance(hi, float) else Fraction(hi)
    return ((lo is None or (v > lo if lo_ex else v >= lo)) and (hi is None or (v < hi if hi_ex else v <= hi)))


# --- integers ------------------------------------------------------------------------------------------------
big = st.integers(-10 ** 35, 10 ** 35)
int_bounds = st.one_of(st.none(), st.integers(-1000, 1000), big)


def _near(*bounds) -> list[int]:
    """Values by each bound and at every digit-count edge around it (10^d - 1, 10^d)."""
    out = [0, 1, -1]
    for b in bounds:
        if b is None:
            continue
        out += [b + d for d in (-2, -1, 0, 1, 2)]
        d = len(str(abs(b)))
        for e in (d - 1, d, d + 1):
            out += [s * (10 ** e + k) for s in (1, -1) for k in (-1, 0, 1) if e >= 0]
    return out


@FAST
@given(lo=int_bounds, hi=int_bounds, lo_ex=st.booleans(), hi_ex=st.booleans(),
       more=st.lists(st.integers(-10 ** 40, 10 ** 40), max_size=12))
def test_integer_ranges_are_exact_at_any_length(lo, hi, lo_ex, hi_ex, more):
    schema = ranged("integer", lo, hi, lo_ex, hi_ex)
    try:
        schema_node(schema)
    except Exception as e:                               # an empty range: refused, and Python agrees
        assert "no value satisfies" in str(e)
        assert lo is not None and hi is not None and lo + lo_ex > hi - hi_ex      # no integer between them
        return
    for v in _near(lo, hi) + more:
        ok = within(Fraction(v), lo, lo_ex, hi, hi_ex)
        assert accepts(schema, str(v)) == ok, (schema, v)
        assert V(schema).is_valid(v) == ok
    assert not accepts(schema, "01") and not accepts(schema, "-01") and not accepts(schema, "00")
    assert not accepts(schema, "1.0") and not accepts(schema, "1e3")
    # "-0": both bounds or neither, and the range holds 0 and a negative value (llguidance's rule)
    has = within(Fraction(0), lo, lo_ex, hi, hi_ex) and within(Fraction(-1), lo, lo_ex, hi, hi_ex)
    assert accepts(schema, "-0") == (has and (lo is None) == (hi is None))


def test_an_open_side_is_a_loop_of_digits():
    """`minimum: 0` is 0 | [1-9][0-9]*: a few states, and no more for 40 digits than for 2."""
    schema = {"type": "integer", "minimum": 0}
    assert _dfa(json.dumps(schema), SchemaOptions())[3] <= 4
    assert accepts(schema, "9" * 400) and accepts(schema, "1" + "0" * 40) and not accepts(schema, "-1")
    assert _dfa(json.dumps({"type": "integer"}), SchemaOptions())[3] <= 6
    assert _dfa(json.dumps({"type": "number"}), SchemaOptions())[3] <= 12


# --- numbers -------------------------------------------------------------------------------------------------
# Bounds jsonschema reads as batchmask does: integers of any size, and floats whose binary value is the decimal
# they are written as (n / 64). Other floats are checked against Python's arithmetic alone (below).
dyadic = st.integers(-64 * 10 ** 6, 64 * 10 ** 6).map(lambda n: n / 64)
num_bounds = st.one_of(st.none(), st.integers(-1000, 1000), big, dyadic)
digits = st.text("0123456789", min_size=1, max_size=40)


@st.composite
def decimal_texts(draw, bounds):
    """Canonical JSON decimals: a sign, an integer part without leading zeros (up to 41 digits, or a bound's own),
    and a fraction of up to 40 digits, trailing zeros allowed."""
    whole = draw(st.one_of(st.just(0), st.integers(1, 99), st.integers(1, 10 ** 41),
                           st.sampled_from([abs(int(b)) for b in bounds if b is not None] or [7])))
    frac = draw(st.one_of(st.just(""), digits.map(lambda f: "." + f)))
    return draw(st.sampled_from(["", "-"])) + str(whole) + frac


def _edges(b) -> list[str]:
    """A bound and values a hair (down to 10^-30) on either side of it."""
    if b is None:
        return []
    d = Decimal(repr(b)) if isinstance(b, float) else Decimal(b)
    with localcontext(prec=100):                          # exact sums for 35-digit bounds
        near = [d + s * Decimal(10) ** -k for s in (1, -1) for k in (0, 1, 3, 7, 16, 30)]
    return [format(x, "f") for x in [d, *near]]


def _has_values(schema: dict) -> bool:
    """Whether the schema compiles; where it does not, its refusal must be that no value satisfies it."""
    try:
        schema_node(schema)
    except Exception as e:
        assert "no value satisfies" in str(e)
        return False
    return True


@FAST
@given(lo=num_bounds, hi=num_bounds, lo_ex=st.booleans(), hi_ex=st.booleans(), data=st.data())
def test_number_ranges_are_exact_at_any_length(lo, hi, lo_ex, hi_ex, data):
    schema = ranged("number", lo, hi, lo_ex, hi_ex)
    if not _has_values(schema):
        assert lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_ex or hi_ex)))
        return
    texts = _edges(lo) + _edges(hi) + data.draw(st.lists(decimal_texts((lo, hi)), max_size=12))
    for s in texts:
        v = Fraction(Decimal(s))
        if lo is None and hi is None:
            assert accepts(schema, s), s                    # JSON's number syntax, no digit cap
            continue
        ok = within(v, lo, lo_ex, hi, hi_ex) and not (s.startswith("-") and v == 0)   # bounded: never -0
        assert accepts(schema, s) == ok, (schema, s)
        if not (s.startswith("-") and v == 0):
            assert V(schema).is_valid(Decimal(s)) == ok, (schema, s)
    if lo is not None or hi is not None:
        assert not accepts(schema, "1e1") and not accepts(schema, "0E0")     # bounded: no exponent
    assert not accepts(schema, "01") and not accepts(schema, "1.") and not accepts(schema, ".5")


@FAST
@given(lo=st.one_of(st.none(), st.decimals(-10 ** 6, 10 ** 6, places=6, allow_nan=False).map(float)),
       hi=st.one_of(st.none(), st.decimals(-10 ** 6, 10 ** 6, places=6, allow_nan=False).map(float)),
       lo_ex=st.booleans(), hi_ex=st.booleans(), data=st.data())
def test_a_float_bound_is_the_decimal_it_is_written_as(lo, hi, lo_ex, hi_ex, data):
    """minimum 0.1 admits 0.1 (docs/json-schema.md): against Fractions of the bounds' repr."""
    schema = ranged("number", lo, hi, lo_ex, hi_ex)
    if not _has_values(schema):
        return
    for s in _edges(lo) + _edges(hi) + data.draw(st.lists(decimal_texts((lo, hi)), max_size=6)):
        v = Fraction(Decimal(s))
        bounded = lo is not None or hi is not None
        ok = within(v, lo, lo_ex, hi, hi_ex) and not (bounded and s.startswith("-") and v == 0)
        assert accepts(schema, s) == ok, (schema, s)


def test_examples():
    s = {"type": "number", "minimum": 1.5}
    assert accepts(s, "1.5") and accepts(s, "1.50") and accepts(s, "1.7") and accepts(s, "2") and accepts(s, "2.01")
    assert not accepts(s, "1.49") and not accepts(s, "1.4" + "9" * 40) and accepts(s, "1.5" + "0" * 40 + "1")
    assert accepts(s, "1" * 40 + "." + "3" * 40)
    s = {"type": "number", "exclusiveMaximum": 0}
    assert accepts(s, "-0." + "0" * 40 + "1") and not accepts(s, "-0.0") and not accepts(s, "0")
    assert accepts(s, "-" + "9" * 40 + ".5")
    s = {"type": "number", "minimum": 0.25, "maximum": 0.75}
    assert accepts(s, "0.25") and accepts(s, "0.2500") and accepts(s, "0.7499999999") and accepts(s, "0.75000")
    assert not accepts(s, "0.2499999999") and not accepts(s, "0.7500000001")
    s = {"type": "number"}
    assert accepts(s, "-0") and accepts(s, "1E+" + "7" * 40) and accepts(s, "0." + "1" * 60)


def test_a_cap_set_still_caps():
    capped = SchemaOptions(int_digits=3, fraction_digits=2, exponent_digits=1)
    assert accepts({"type": "integer"}, "999", capped) and not accepts({"type": "integer"}, "1000", capped)
    assert accepts({"type": "integer", "minimum": 5}, "999", capped)
    assert not accepts({"type": "integer", "minimum": 5}, "1000", capped)
    assert accepts({"type": "number"}, "-999.99e9", capped)
    assert not accepts({"type": "number"}, "1.234", capped) and not accepts({"type": "number"}, "1e12", capped)
    assert accepts({"type": "number", "minimum": 1.5}, "999.99", capped)
    assert not accepts({"type": "number", "minimum": 1.5}, "1000", capped)
    assert not accepts({"type": "number", "minimum": 1.5}, "1.505", capped)


@pytest.mark.parametrize("name, value, low", [("int_digits", 0, 1), ("fraction_digits", -1, 0),
                                              ("exponent_digits", 1.5, 0)])
def test_digit_caps_are_validated_and_may_be_none(name, value, low):
    with pytest.raises(ValueError, match=rf"SchemaOptions.{name} must be an integer >= {low} or None \(no cap\)"):
        SchemaOptions(**{name: value})
    assert getattr(SchemaOptions(), name) is None
    assert getattr(SchemaOptions(**{name: 4}), name) == 4


# --- llguidance ----------------------------------------------------------------------------------------------
@cache
def _llg_tokenizer():
    llg = pytest.importorskip("llguidance")

    class Bytes:                         # one token per byte and an end token: a matcher that reads text
        is_tokenizer_wrapper = True
        tokens = [bytes([b]) for b in range(256)] + [b""]
        eos_token_id, bos_token_id, special_token_ids = 256, None, [256]

        def __call__(self, s):
            return []
    return llg, llg.LLTokenizer(Bytes(), eos_token=[256])


@cache
def _llg_matcher(schema_text: str):
    llg, tok = _llg_tokenizer()
    grammar = json.loads(llg.LLMatcher.grammar_from_json_schema(
        schema_text, defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}))
    body = grammar["grammars"][0]["json_schema"]
    m = llg.LLMatcher(tok, '%llguidance {"no_forcing": true}\nstart: %json ' + json.dumps(body), log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def llg_accepts(schema: dict, text: str) -> bool:
    """Whether llguidance's matcher of `schema` (compact JSON) takes the whole of `text`."""
    m = _llg_matcher(json.dumps(schema, sort_keys=True)).deep_copy()      # a refused byte leaves it in error
    return all(m.consume_token(b) for b in text.encode()) and m.is_accepting()


llg_bound = st.integers(-10 ** 15, 10 ** 15)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lo=st.one_of(st.none(), llg_bound), hi=st.one_of(st.none(), llg_bound),
       more=st.lists(st.integers(-10 ** 40, 10 ** 40), max_size=6))
def test_llguidance_agrees_on_integers(lo, hi, more):
    """Bounds within 2^53 (llguidance reads a schema's numbers as doubles), values of up to 40 digits."""
    schema = ranged("integer", lo, hi, False, False)
    if lo is not None and hi is not None and lo > hi:
        return
    for v in _near(lo, hi) + more:
        assert accepts(schema, str(v)) == llg_accepts(schema, str(v)), (schema, v)
    assert accepts(schema, "-0") == llg_accepts(schema, "-0")


@pytest.mark.parametrize("schema", [{"type": "number"}, {"type": "number", "minimum": 1.5},
                                    {"type": "number", "exclusiveMaximum": -2},
                                    {"type": "number", "minimum": -3, "maximum": 10 ** 15}])
def test_llguidance_agrees_on_numbers(schema):
    """llguidance 1.9's bounded-number regexes refuse some in-range spellings (tests/test_schema_oracle.py,
    LLG_NUMBER_RANGES) and may write -0.0: where they accept, we do; unbounded, the two are equal."""
    texts = ["0", "-0", "1.5", "1.50", "1.4999", "2", "-2", "-2.0001", "-1.9", "1" * 35, "-" + "4" * 35 + ".25",
             "0." + "0" * 30 + "1", "1.5" + "0" * 30 + "1", "1e5", "1.25E-" + "3" * 30, "01", "1.", ".5", "9" * 31,
             "-3", "-3.0000000001", "1" + "0" * 15, "1" + "0" * 15 + ".0", "9" * 15 + ".5", "1" + "0" * 15 + ".0001"]
    for s in texts:
        ours, theirs = accepts(schema, s), llg_accepts(schema, s)
        if len(schema) == 1:
            assert ours == theirs, s
            continue
        if theirs and not (s.startswith("-") and Fraction(Decimal(s)) == 0):
            assert ours, s
        if ours:
            assert V(schema).is_valid(Decimal(s)), s


def test_the_validator_reads_any_number_the_grammar_writes():
    """batchmask.schema.validate.loads: an exponent past Decimal's range, an integer past Python's 4300 digits."""
    from batchmask.schema.validate import check, loads
    assert check(loads("1.5e" + "9" * 30), {"type": "number"}) is None
    assert check(loads("-1.5e-" + "9" * 30), {"type": "number", "not": {"minimum": 0}}) is None
    assert check(loads("7" * 5000), {"type": "integer", "minimum": 0}) is None
    assert check(loads("-" + "7" * 5000), {"type": "integer", "minimum": 0}) is not None


def test_time_fractions_take_any_length_and_fit_a_max_length():
    """A time's fraction has no cap; with maxLength, as many digits as fit before each offset (exact)."""
    from batchmask.schema.nodes import node_accepts

    def takes(schema: dict, text: str) -> bool:
        return node_accepts(schema_node(schema), json.dumps(text).encode())
    free = {"type": "string", "format": "date-time"}
    assert takes(free, "2024-02-29T12:00:00." + "9" * 40 + "Z") and takes(free, "2024-02-29T23:59:59.5+01:00")
    fit = {"type": "string", "format": "time", "maxLength": 18}
    for frac in range(12):
        for offset in ("Z", "+01:30"):
            text = "12:34:56" + ("." + "7" * frac if frac else "") + offset
            assert takes(fit, text) == (len(text) <= 18 and V(fit, format_checker=V.FORMAT_CHECKER).is_valid(text))


def test_a_schema_task_reads_an_integer_past_pythons_limit():
    from batchmask.run.schema_task import SchemaTask
    task = SchemaTask({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"]})
    value, reason = task.parse('{"n":' + "7" * 5000 + "}")
    assert reason is None and value == {"n": Decimal("7" * 5000)}
    assert task.parse('{"n":-' + "7" * 5000 + "}")[0] is None


# --- integer multipleOf --------------------------------------------------------------------------------------
steps = st.sampled_from([1, 2, 3, 5, 7, 10, 25, 100, 1000, 10 ** 6])
small_bounds = st.one_of(st.none(), st.integers(-3000, 3000))


@FAST
@given(steps, small_bounds, st.booleans(), small_bounds, st.booleans(), st.lists(st.integers(-10 ** 8, 10 ** 8),
                                                                                 max_size=6))
def test_integer_multiples_are_exactly_jsonschemas(k, lo, lo_ex, hi, hi_ex, extra):
    """multipleOf on an integer schema, written exactly where numbers.multiples_node can (a step of 1 or 10^m, or
    at most MULTIPLES_LISTED multiples between two bounds): the automaton takes a canonical integer text iff
    jsonschema says the value is valid. Elsewhere lenient mode reports the keyword (a superset) and strict refuses
    it, naming it."""
    from batchmask.schema import base
    from batchmask.schema.base import SchemaError
    schema = {**ranged("integer", lo, hi, lo_ex, hi_ex), "multipleOf": k}
    near = [b + j * k + d for b in (lo, hi) if b is not None for j in range(-2, 3) for d in (-1, 0, 1)]
    near += [(b // k + j) * k + d for b in (lo, hi) if b is not None for j in range(-1, 3) for d in (-1, 0, 1)]
    values = near + extra + [0, k, -k, k + 1, 3 * k, -3 * k]
    with base.collect() as relaxed:
        try:
            schema_node(schema, SchemaOptions())
        except SchemaError as e:                           # no multiple in range: refused as such
            assert "no value satisfies" in str(e) and not any(V(schema).is_valid(v) for v in values)
            return
    if relaxed:
        assert [r.keyword for r in relaxed] == ["multipleOf"]
        with pytest.raises(SchemaError, match="multipleOf"):
            schema_node(schema, SchemaOptions(mode="strict"))
        return
    for v in values:
        valid = V(schema).is_valid(v)
        assert accepts(schema, str(v)) is valid, (schema, v)
    assert not accepts(schema, "-0") or V(schema).is_valid(0)


def test_which_integer_multiples_are_written():
    from batchmask.schema import base
    cases = [({"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100}, True),
             ({"type": "integer", "multipleOf": 100}, True),
             ({"type": "integer", "multipleOf": 0.5, "maximum": 3}, True),          # every integer
             ({"type": "integer", "multipleOf": 7}, False),
             ({"type": "integer", "multipleOf": 7, "minimum": 0, "maximum": 10 ** 6}, False),
             ({"type": "number", "multipleOf": 5, "minimum": 0, "maximum": 100}, True),    # 21 literals
             ({"type": "number", "multipleOf": 0.01}, True),
             ({"type": "number", "multipleOf": 0.5}, False),
             ({"type": "number", "multipleOf": 7}, False)]
    for schema, exact in cases:
        with base.collect() as relaxed:
            schema_node(schema, SchemaOptions())
        assert (not relaxed) is exact, schema
    assert accepts({"type": "integer", "multipleOf": 100}, "7" * 30 + "00")
    assert not accepts({"type": "integer", "multipleOf": 100}, "7" * 30 + "10")


# --- number multipleOf -----------------------------------------------------------------------------------------
def spelled(v: Fraction) -> str:
    """The shortest fixed-point spelling of a finite decimal (no exponent, no trailing zeros, never "-0")."""
    whole, rest = divmod(abs(v.numerator), v.denominator)
    digits = ""
    while rest:
        whole_digit, rest = divmod(rest * 10, v.denominator)
        digits += str(whole_digit)
    return ("-" if v < 0 else "") + str(whole) + ("." + digits if digits else "")


@FAST
@given(st.sampled_from(["1", "5", "100", "0.1", "0.01", "0.001"]),
       st.one_of(st.none(), st.integers(-3000, 3000).map(lambda n: n / 100)), st.booleans(),
       st.one_of(st.none(), st.integers(-3000, 3000).map(lambda n: n / 100)), st.booleans(),
       st.lists(st.integers(-10 ** 6, 10 ** 6), max_size=8))
def test_number_multiples_are_exactly_pythons(k, lo, lo_ex, hi, hi_ex, extra):
    """multipleOf k on a number schema, for an integer k or k = 10^-m (numbers.number_multiples): the automaton
    takes a value's shortest fixed-point spelling iff Python's Fraction arithmetic says it lies within the bounds
    and k divides it."""
    from batchmask.schema.base import SchemaError
    step = Fraction(k)
    schema = {**ranged("number", lo, hi, lo_ex, hi_ex), "multipleOf": float(k) if "." in k else int(k)}
    unit = Fraction(1, 10 ** (len(k.partition(".")[2]) + 1))            # probes one digit finer than the step
    near = [round(Fraction(repr(b)) / unit) + d for b in (lo, hi) if b is not None for d in range(-12, 13)]
    values = [n * unit for n in near + extra + [0, 1, -1]]
    values += [j * step for j in range(-3, 4)]
    try:
        schema_node(schema, SchemaOptions(mode="strict"))
    except SchemaError as e:                               # no multiple in range, or a step it does not write
        if "no value satisfies" in str(e):
            assert not any(within(v, lo, lo_ex, hi, hi_ex) and (v / step).denominator == 1 for v in values)
            return
        assert step.denominator == 1 and "multipleOf" in str(e)   # an integer step over a wide range
        return
    for v in values:
        expected = within(v, lo, lo_ex, hi, hi_ex) and (v / step).denominator == 1
        assert accepts(schema, spelled(v)) is expected, (schema, spelled(v))
