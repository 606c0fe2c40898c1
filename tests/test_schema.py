"""JSON Schema -> grammar nodes, checked against jsonschema (formats on) and a regex written apart.

(a) random members of each node's language (a walk over the tree) validate; (b) values made from the
schema alone (hypothesis) are in the language iff jsonschema accepts them, within the documented caps.
"""
import functools
import json
import random
import re
from decimal import Decimal, InvalidOperation

import jsonschema
import pytest
from data_paths import CATALOGUE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_reference import compile_regex, walk

from batchmask.errors import SchemaError
from batchmask.schema.build import SchemaOptions, json_literal, schema_node

V = jsonschema.Draft202012Validator
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def valid(schema, value) -> bool:
    return V(schema, format_checker=V.FORMAT_CHECKER).is_valid(value)


def _decimal(text: str):
    try:
        return Decimal(text)
    except InvalidOperation:          # an exponent past Decimal's range (exponents have no cap): 0.0 or +-inf
        return float(text)


def decode(data: bytes):
    return json.loads(data.decode("utf-8"), parse_float=_decimal)


def check_walks(schema, n=200, seed=0, options=None, separators=(",", ":")):
    """(a): every walk parses as JSON, validates, and the reference regex agrees it is in the language."""
    node = schema_node(schema, options or SchemaOptions(), separators=separators)
    rx = compile_regex(node)
    rng = random.Random(seed)
    for _ in range(n):
        data = walk(node, rng)
        assert rx.fullmatch(data), data
        value = decode(data)
        assert valid(schema, value), (schema, data)
        outside = re.sub(rb'"(?:[^"\\]|\\.)*"', b"", data)        # the text outside string literals
        if separators == (",", ":"):
            assert not re.search(rb"\s", outside), data               # compact: no whitespace at all
    return node, rx


# --- (a) random walks -------------------------------------------------------------------------------
WALK_SCHEMAS = [
    {"type": "string", "minLength": 2, "maxLength": 12},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "time"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "ipv4"},
    {"type": "string", "format": "ipv6"},
    {"type": "string", "format": "uri-reference"},
    {"type": "string", "format": "hostname"},
    {"type": "string", "format": "email", "maxLength": 40},
    {"type": "string", "format": "email"},
    {"type": "string", "format": "uri", "minLength": 1, "maxLength": 100},
    {"type": "string", "format": "uri"},
    {"type": "string", "pattern": "^[A-Z]{2}-\\d{3,5}(\\.[a-f]+)?$"},
    {"type": "string", "pattern": "^(?:foo|ba[rz])+[^a-z\"]?$"},
    {"type": "string", "pattern": "x\\d"},
    {"type": "integer", "minimum": -1234, "maximum": 98765},
    {"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 1001},
    {"type": "integer"},
    {"type": "number", "minimum": -2.5, "maximum": 1e3},
    {"type": "number", "exclusiveMinimum": 0},
    {"type": "number"},
    {"type": ["string", "null"], "maxLength": 3},
    {"enum": ["a\"b", 1, 2.5, None, True, [1, {"k": "\u007f"}], {"x\n": [None]}]},
    {"const": {"é": "\\", "n": -0.0}},
    {"type": "string", "enum": ["ok", "no", 3], "maxLength": 2},
    {"enum": ["abc", "ab", 5, 7, [1, 2, 3], None], "maxLength": 2, "minimum": 6},
    {"anyOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "integer", "maximum": 3}, "maxItems": 3}]},
    {"oneOf": [{"type": "string", "maxLength": 4}, {"type": "integer"}, {"const": None}]},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 2}],
     "items": {"type": "boolean"}, "minItems": 1, "maxItems": 5},
    {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b\"\\": {"type": "string", "maxLength": 4},
                                      "c": {"type": "boolean"}, "d": {"type": "null"}},
     "required": ["c"], "additionalProperties": False},
    {"type": "object", "properties": {"x": {"type": "object", "properties": {"y": {"$ref": "#/$defs/Y"}}}},
     "$defs": {"Y": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "maxItems": 2}}},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                         "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                  "maxItems": 2}},
                        "required": ["v"]}},
     "$ref": "#/$defs/node"},
    {"allOf": [{"type": "string", "maxLength": 2}], "description": "one branch"},
]


@pytest.mark.parametrize("schema", WALK_SCHEMAS, ids=lambda s: json.dumps(s)[:60])
def test_random_walks_validate(schema):
    check_walks(schema)


def test_separators_are_honoured_everywhere():
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer", "minimum": 0},
                                                     "minItems": 2,
                                                     "maxItems": 3},
                                               "b": {"const": {"k": [1, 2]}}}, "required": ["a", "b"]}
    node, rx = check_walks(schema, separators=(", ", ": "))
    data = walk(node, random.Random(3))
    value = json.loads(data)
    assert data.decode() == json.dumps(value, separators=(", ", ": "), ensure_ascii=False)


def test_recursion_is_unrolled_to_ref_depth():
    schema = WALK_SCHEMAS[-2]
    for depth in (1, 2, 3):
        node = schema_node(schema, SchemaOptions(ref_depth=depth))
        rx = compile_regex(node)
        deep = {"v": 1}
        for _ in range(depth - 1):
            deep = {"v": 2, "kids": [deep]}
        assert rx.fullmatch(json.dumps(deep, separators=(",", ":")).encode())
        assert not rx.fullmatch(json.dumps({"v": 0, "kids": [deep]}, separators=(",", ":")).encode())


# --- the shared catalogue -------------------------------------------------------------------------
def test_catalogue_every_tool_builds_and_its_calls_validate():
    tools = json.loads(CATALOGUE.read_text())["tools"]
    rng = random.Random(7)
    for entry in tools:
        fn = entry["function"]
        node = schema_node(fn["parameters"], where=fn["name"])
        rx = compile_regex(node)
        strict = dict(fn["parameters"], additionalProperties=False)
        for _ in range(60):
            data = walk(node, rng)
            assert rx.fullmatch(data)
            assert valid(strict, decode(data)), (fn["name"], data)


def test_catalogue_required_and_optional_properties():
    fn = {t["function"]["name"]: t["function"] for t in json.loads(CATALOGUE.read_text())["tools"]}
    rx = compile_regex(schema_node(fn["book_flight"]["parameters"]))
    ok = {"origin": "CDG", "destination": "JFK", "date": "2024-02-29", "passengers": {"adults": 2}}
    assert rx.fullmatch(json.dumps(ok, separators=(",", ":")).encode())
    assert rx.fullmatch(json.dumps(dict(ok, cabin="first"), separators=(",", ":")).encode())
    for bad in [dict(ok, date="2023-02-29"), {k: v for k, v in ok.items() if k != "date"},
                dict(ok, passengers={"adults": 0}), dict(ok, origin="CDGX"), dict(ok, extra=1),
                {"destination": "JFK", **{k: v for k, v in ok.items() if k != "destination"}}]:
        assert not rx.fullmatch(json.dumps(bad, separators=(",", ":")).encode()), bad


# --- (b) independent values: in the language iff jsonschema accepts them ---------------------------
def matches(rx, data: bytes) -> bool:
    return rx.fullmatch(data) is not None


bounds = st.one_of(st.none(), st.integers(-10 ** 6, 10 ** 6))


def ranged(kind: str, lo, hi, lo_ex: bool, hi_ex: bool) -> dict:
    """A schema of `kind` with the bounds given (None: that side open), each exclusive or not."""
    schema = {"type": kind}
    if lo is not None:
        schema["exclusiveMinimum" if lo_ex else "minimum"] = lo
    if hi is not None:
        schema["exclusiveMaximum" if hi_ex else "maximum"] = hi
    return schema


@FAST
@given(lo=bounds, hi=bounds, lo_ex=st.booleans(), hi_ex=st.booleans(), data=st.data())
def test_integer_ranges_are_exact(lo, hi, lo_ex, hi_ex, data):
    schema = ranged("integer", lo, hi, lo_ex, hi_ex)
    try:
        rx = compile_regex(schema_node(schema))
    except Exception as e:                                   # empty range: refused, and jsonschema agrees
        assert "no value satisfies" in str(e)
        assert not any(valid(schema, v) for v in range(-10 ** 6 - 2, 10 ** 6 + 3, 997))
        return
    near = [b + d for b in (lo, hi, 0) if b is not None for d in (-2, -1, 0, 1, 2)]
    values = near + data.draw(st.lists(st.integers(-10 ** 16, 10 ** 16) | st.integers(-10 ** 40, 10 ** 40),
                                       max_size=10))
    for v in values:                                         # no digit cap: 40-digit values too
        assert matches(rx, str(v).encode()) == valid(schema, v), (schema, v)
    # Never a leading zero; "-0" when the range holds 0 and a negative value, and the schema has both
    # bounds or neither (documented; llguidance's rule).
    assert not matches(rx, b"01") and not matches(rx, b"-01") and not matches(rx, b"1.0")
    has0, has_neg = valid(schema, 0), valid(schema, -1)
    assert matches(rx, b"-0") == (has0 and has_neg and (lo is None) == (hi is None))


def decimal_strings():
    int_part = st.one_of(st.just("0"), st.integers(1, 10 ** 15 - 1).map(str), st.integers(1, 10 ** 40).map(str))
    frac = st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=6).map(lambda f: "." + f),
                     st.text("0123456789", min_size=7, max_size=30).map(lambda f: "." + f))
    return st.tuples(st.sampled_from(["", "-"]), int_part, frac).map("".join)


quarters = st.one_of(st.none(), st.integers(-4000, 4000).map(lambda q: q / 4))


@FAST
@given(lo=quarters, hi=quarters, lo_ex=st.booleans(), hi_ex=st.booleans(), data=st.data())
def test_number_ranges_are_exact(lo, hi, lo_ex, hi_ex, data):
    schema = ranged("number", lo, hi, lo_ex, hi_ex)
    try:
        rx = compile_regex(schema_node(schema))
    except Exception as e:
        assert "no value satisfies" in str(e)
        return
    near = []
    for b in (lo, hi):
        if b is not None:
            for d in ("0", "0.000001", "0.25", "1", "0.0000001"):
                for sign in (1, -1):
                    near.append(format(Decimal(repr(b)) + sign * Decimal(d), "f"))
    values = near + data.draw(st.lists(decimal_strings(), max_size=12))
    for s in values:
        d = Decimal(s)
        if lo is None and hi is None:
            assert matches(rx, s.encode())                  # JSON's number syntax, no digit cap
            continue
        if s.startswith("-") and d == 0:
            assert not matches(rx, s.encode())              # bounded numbers never write -0
            continue
        assert matches(rx, s.encode()) == valid(schema, d), (schema, s)
    if lo is not None or hi is not None:
        assert not matches(rx, b"1e1") and not matches(rx, b"0E0")     # bounded: no exponent


@FAST
@given(st.text(alphabet="0123456789-+.eE", max_size=10))
def test_unbounded_number_is_json_number_syntax(s):
    rx = compile_regex(schema_node({"type": "number"}))
    m = re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", s)
    assert matches(rx, s.encode()) == (m is not None), s


json_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=14)


@FAST
@given(lo=st.integers(0, 6), span=st.integers(0, 8), s=json_text)
def test_string_lengths_and_escapes(lo, span, s):
    schema = {"type": "string", "minLength": lo, "maxLength": lo + span}
    rx = compile_regex(schema_node(schema))
    data = json_literal(s)
    assert matches(rx, data) == valid(schema, s), (schema, s)
    # the same string with its escapes in upper-case hex is the same value, and as legal
    upper = re.sub(rb"\\u00([0-9a-f]{2})", lambda m: b"\\u00" + m.group(1).upper(), data)
    assert matches(rx, upper) == valid(schema, s)
    # what JSON forbids raw never passes: a raw control byte, a raw quote inside, a lone backslash
    for bad in (b'"\x01"', b'"a"b"', b'"\\"', b'"\\/"', b'"\\u0041"', b'"\xed\xa0\x80"', b'"\xc0\x80"'):
        assert not matches(rx, bad)


@FAST
@given(y=st.integers(0, 10000), m=st.integers(0, 13), d=st.integers(0, 32))
def test_date_format_iff_checker(y, m, d):
    schema = {"type": "string", "format": "date"}
    rx = compile_regex(schema_node(schema))
    s = "%04d-%02d-%02d" % (y, m, d)
    assert matches(rx, json_literal(s)) == valid(schema, s), s


@FAST
@given(h=st.integers(0, 25), mi=st.integers(0, 61), sec=st.integers(0, 61), frac=st.text("0123456789", max_size=6),
       off=st.one_of(st.sampled_from(["Z", "z", ""]),
                     st.tuples(st.sampled_from("+-"), st.integers(0, 25), st.integers(0, 61))
                     .map(lambda t: "%s%02d:%02d" % t)),
       date=st.sampled_from(["2024-02-29", "2023-02-29", "1999-12-31", "0000-01-01"]), sep=st.sampled_from("Tt "))
def test_time_and_date_time_iff_checker(h, mi, sec, frac, off, date, sep):
    t = "%02d:%02d:%02d%s%s" % (h, mi, sec, "." + frac if frac else "", off)
    for fmt, s in (("time", t), ("date-time", date + sep + t)):
        schema = {"type": "string", "format": fmt}
        rx = compile_regex(schema_node(schema))
        assert matches(rx, json_literal(s)) == valid(schema, s), s


@FAST
@given(st.text(alphabet="0123456789abcdefABCDEFg-", min_size=36, max_size=36))
def test_uuid_iff_checker(s):
    schema = {"type": "string", "format": "uuid"}
    rx = compile_regex(schema_node(schema))
    assert matches(rx, json_literal(s)) == valid(schema, s), s


@FAST
@given(st.lists(st.integers(0, 300), min_size=4, max_size=4), st.booleans())
def test_ipv4_iff_checker(octets, pad):
    schema = {"type": "string", "format": "ipv4"}
    rx = compile_regex(schema_node(schema))
    s = ".".join(("0%d" if pad and i == 1 else "%d") % o for i, o in enumerate(octets))
    assert matches(rx, json_literal(s)) == valid(schema, s), s


@FAST
@given(st.integers(0, 2 ** 128 - 1), st.sampled_from(["compressed", "exploded", "upper", "v4"]),
       st.text(alphabet="0123456789abcdefABCDEF:.%", max_size=24))
def test_ipv6_iff_checker(value, form, noise):
    """Python's ipaddress (jsonschema's checker) on its own spellings of random addresses and on random text."""
    import ipaddress
    schema = {"type": "string", "format": "ipv6"}
    rx = compile_regex(schema_node(schema))
    a = ipaddress.IPv6Address(value)
    s = {"compressed": a.compressed, "exploded": a.exploded, "upper": a.exploded.upper(),
         "v4": a.exploded[:30] + str(ipaddress.IPv4Address(value & 0xFFFFFFFF))}[form]
    for text in (s, noise, s + noise):
        assert matches(rx, json_literal(text)) == valid(schema, text), text


@FAST
@given(st.text(alphabet="ab:/?#%41.-_~!$&'()*+,;=@", max_size=16))
def test_uri_reference_only_valid_ones(s):
    """Narrowed: every text the grammar takes is valid by rfc3986-validator's URI_reference (jsonschema's checker);
    the relative references the narrowing keeps (a path, ?query, #fragment, empty) are taken."""
    schema = {"type": "string", "format": "uri-reference"}
    rx = compile_regex(schema_node(schema))
    if matches(rx, json_literal(s)):
        assert valid(schema, s), s
    for kept in ("", "/", "/a/b", "a/b", "?q", "#f", "a/b?c#d", "%41b", "./a", "../b", "a/b:c", "http://x.io/a"):
        assert matches(rx, json_literal(kept)), kept


PATTERNS = ["^[A-Z]{3}$", "^[a-z0-9_]+$", "^(\\+|-)?\\d{1,4}(\\.\\d\\d)?$", "^[^\"\\\\a]{2,5}$", "^a|b$",
            "^(?:ab|c)*d?$", "^\\w\\s\\.[\\]x-]$", "^.{3}$", "^\\u00e9+\\x41$", "ab",
            # class escapes read by both readings: \\D, [^\\w] and \\S hold no Unicode digit, letter or space
            "^\\S+\\D\\W$", "^[^\\w\\s]{1,3}$", "^[\\S]x?[^\\D]$", "^[^\\d]\\s$"]


@functools.cache
def pattern_regex(pattern: str) -> re.Pattern:
    return compile_regex(schema_node({"type": "string", "pattern": pattern},
                                     SchemaOptions(repeat_cap=8, max_string_length=8)))


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=80, deadline=None)
@given(s=st.text(alphabet='abcdxyzABC019_+-. \n"\\é]\u0663\u00a0\u2028', max_size=8))
def test_pattern_iff_search_within_caps(pattern, s):
    if s.endswith("\n"):
        return                          # Python's $ also matches before a final newline; we do not write that
    # Within the caps (8 characters, 8 repeats) a body is written iff the pattern matches at its start
    # (re.match): re.search's free characters before the match are not written (docs/json-schema.md); and in
    # both readings of \d \w \s, Python's Unicode ones and ECMA-262's ASCII ones (re.ASCII stands in for it:
    # the alphabet holds no space that only ECMA-262 has, U+FEFF)
    full = re.match(pattern, s) is not None and re.match(pattern, s, re.ASCII) is not None
    assert matches(pattern_regex(pattern), json_literal(s)) == full, (pattern, s)


@FAST
@given(values=st.lists(st.recursive(st.none() | st.booleans() | st.integers(-99, 99) | json_text,
                                    lambda c: st.lists(c, max_size=3) | st.dictionaries(json_text, c, max_size=3),
                                    max_leaves=6), min_size=1, max_size=5),
       probe=st.recursive(st.none() | st.booleans() | st.integers(-99, 99) | json_text,
                          lambda c: st.lists(c, max_size=3), max_leaves=4))
def test_enum_iff(values, probe):
    schema = {"enum": values}
    rx = compile_regex(schema_node(schema))
    for v in values + [probe]:
        assert matches(rx, json_literal(v)) == valid(schema, v), v
        if isinstance(v, str):          # a string value may write its escapes as \u00XX too: the same value
            spelled = "".join("\\u%04X" % ord(c) if ord(c) < 0x20 or c == "\x7f"
                              else json.dumps(c, ensure_ascii=False)[1:-1] for c in v)
            assert matches(rx, ('"' + spelled + '"').encode()) == valid(schema, v), spelled


def test_json_literal_matches_json_dumps():
    for v in ["a\"\\\n\x00\u2028é😀", {"k": [1, 2.5, None, True]}, -0.0, 10 ** 30, 1e-7, []]:
        assert json_literal(v) == json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode()
        assert json_literal(v, (", ", ": ")) == json.dumps(v, ensure_ascii=False, separators=(", ", ": ")).encode()
    assert json_literal("a\x7fb") == b'"a\\u007fb"'                     # DEL escaped like every string body
    for bad in (float("nan"), "\ud800", {1: 2}, object()):
        with pytest.raises(ValueError):
            json_literal(bad)


# --- (a) on generated schemas ---------------------------------------------------------------------
def _leaf():
    bound = st.one_of(st.none(), st.integers(-500, 500), st.sampled_from([0.5, -2.25, 7.125]))

    def numeric(t, lo, hi, ex):
        s = {"type": t}
        if lo is not None:
            s["exclusiveMinimum" if ex else "minimum"] = lo
        if hi is not None:
            s["maximum"] = hi if lo is None else max(hi, lo + 1)
        return s
    strings = st.builds(lambda lo, span: {"type": "string", "minLength": lo, "maxLength": lo + span},
                        st.integers(0, 3), st.integers(0, 5))
    patterns = st.builds(lambda p: {"type": "string", "pattern": p},
                         st.sampled_from(["^[a-c\"]{1,3}x?$", "^(\\d\\d|[é\\\\])+$", "b.c"]))
    return st.one_of(
        strings, patterns,
        st.builds(lambda f: {"type": "string", "format": f}, st.sampled_from(["date", "time", "date-time", "uuid"])),
        st.builds(numeric, st.sampled_from(["integer", "number"]), bound, bound, st.booleans()),
        st.just({"type": "boolean"}), st.just({"type": "null"}),
        st.builds(lambda n: {"type": ["string", "null"], "maxLength": n}, st.integers(0, 4)),
        st.builds(lambda vs: {"enum": vs}, st.lists(st.one_of(st.none(), st.integers(-9, 9), json_text),
                                                    min_size=1, max_size=4)))


def _containers(inner):
    keys = st.sampled_from(["a", "b", "é", 'q"', "k\\", "a b"])
    arrays = st.builds(lambda it, lo, span: {"type": "array", "items": it, "minItems": lo, "maxItems": lo + span},
                       inner, st.integers(0, 2), st.integers(0, 3))
    objects = st.builds(lambda props, req: {"type": "object", "properties": dict(props),
                                            "required": [k for k, _ in props][:req]},
                        st.lists(st.tuples(keys, inner), max_size=3, unique_by=lambda kv: kv[0]), st.integers(0, 3))
    unions = st.builds(lambda bs: {"anyOf": bs}, st.lists(inner, min_size=1, max_size=3))
    return st.one_of(arrays, objects, unions)


generated_schemas = st.recursive(_leaf(), _containers, max_leaves=6)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=generated_schemas, seed=st.integers(0, 2 ** 16), spaced=st.booleans())
def test_walks_of_generated_schemas_validate(schema, seed, spaced):
    try:
        schema_node(schema)
    except Exception as e:
        assert "no value satisfies" in str(e), e          # only an empty language may be refused here
        return
    check_walks(schema, n=15, seed=seed, separators=(", ", ": ") if spaced else (",", ":"))


def test_a_ref_target_used_in_many_places_is_built_once_per_walk(monkeypatch):
    """The walk keeps what it built under $refs (schema/build.py `_build_in_walk`): a target used in forty places
    at one depth is walked once, gives the same language everywhere, and what lenient mode relaxed inside it is
    still reported."""
    import batchmask.schema.build as build
    from batchmask.schema.base import collect
    target = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                         "uniqueItems": True}}, "required": ["tags"]}
    schema = {"$defs": {"t": target}, "type": "object",
              "properties": {f"p{i}": {"$ref": "#/$defs/t"} for i in range(40)}, "required": ["p0", "p39"]}
    calls, real = [], build._build_new

    def counted(sub, ptr, ctx):
        calls.append(sub is target)
        return real(sub, ptr, ctx)
    monkeypatch.setattr(build, "_build_new", counted)
    with collect() as relaxed:
        node = schema_node(schema)
    assert sum(calls) == 1
    assert {r.ptr for r in relaxed} == {"#/$defs/t/properties/tags/uniqueItems"}
    regex = compile_regex(node)
    for value in ({"p0": {"tags": ["a", "b"]}, "p39": {"tags": []}},
                  {"p0": {"tags": []}, "p7": {"tags": ["x"]}, "p39": {"tags": ["y", "z"]}}):
        jsonschema.validate(value, schema)
        text = json.dumps(value, separators=(",", ":"))
        assert regex.fullmatch(text.encode()), text


ONE_OF_OBJECTS = [
    # a discriminator both branches require: its values share nothing
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                "required": ["kind"]},
               {"type": "object", "properties": {"kind": {"enum": ["b", "c"]}, "y": {"type": "string"}},
                "required": ["kind", "y"]}]},
    # each requires a property the other, closed by additionalProperties: false, does not declare
    {"oneOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
                "additionalProperties": False},
               {"type": "object", "properties": {"y": {"type": "string"}}, "required": ["y"],
                "additionalProperties": False}]},
]


@pytest.mark.parametrize("schema", ONE_OF_OBJECTS)
def test_one_of_objects_told_apart_by_their_properties(schema):
    """Strict mode writes a oneOf of objects that no object satisfies twice; every value drawn from the grammar
    validates against the schema as jsonschema reads it (the specification's open objects, oneOf's exclusivity)."""
    node = schema_node(schema, SchemaOptions(mode="strict"))
    rng = random.Random(3)
    for _ in range(200):
        jsonschema.validate(json.loads(walk(node, rng)), schema)


def test_one_of_objects_that_may_overlap_stay_refused():
    """Open objects each requiring its own property: {"x": 1, "y": "a"} satisfies both, so strict mode refuses."""
    schema = {"oneOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
                        {"type": "object", "properties": {"y": {"type": "string"}}, "required": ["y"]}]}
    with pytest.raises(SchemaError, match="oneOf branches 0 and 1 may both match"):
        schema_node(schema, SchemaOptions(mode="strict"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"x": 1, "y": "a"}, schema)
