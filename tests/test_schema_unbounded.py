"""No cap where the schema gives none (issue 24): long values are accepted token by token, loops cost one copy.

Strings without maxLength, arrays without maxItems, maps without maxProperties and a pattern's `*`/`+` take any
length: a value far past the old default caps (256 characters, 16 items, 16 repetitions) is walked through the
compiled table on Llama 2's vocabulary and checked against jsonschema, the library that defines the language.
The automaton's size is checked as a behaviour, not a number: an array nested one level deeper adds a constant
number of states (one copy of the item), and an enum beside a free string is the free string's automaton.
"""
from __future__ import annotations

import json
import random
import re
from functools import cache

import jsonschema
import pytest
from data_paths import LLAMA2
from schema_reference import compile_regex

from batchmask.api import compile_json_schema
from batchmask.automaton.tree import build_node_automaton
from batchmask.schema.build import SchemaOptions, json_literal, schema_node


@cache
def tokenizer():
    from batchmask.models.tokenizer import load_tokenizer
    return load_tokenizer(LLAMA2 / "tokenizer.model")


@cache
def grammar(schema_text: str, **options):
    return compile_json_schema(json.loads(schema_text), tokenizer(), options=SchemaOptions(**options))


def accepted(schema: dict, text: str, **options) -> bool:
    """Whether the compiled table takes `text` token by token (the tokenizer's own spelling) and then a stop."""
    g, tok = grammar(json.dumps(schema, sort_keys=True), **options), tokenizer()
    ids = tok.encode(text, bos=False, prefix_space=False)
    assert b"".join(tok.token_bytes[i] for i in ids) == text.encode("utf-8")
    state = g.start
    for i in ids:
        state = int(g.next_state([state], [i])[0])
        if state < 0:
            return False
    return bool(g.is_final([state])[0]) and int(g.next_state([state], [tok.eos_id])[0]) >= 0


def check(schema: dict, value, **options) -> None:
    """`value` (valid by jsonschema) is accepted, written compactly."""
    jsonschema.validate(value, schema)
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert accepted(schema, text, **options), f"{text[:80]}... refused"


LONG_TEXT = ("Grüße, 世界! \"quoted\" \\ back\nslash\t" * 40)           # 1480 characters, escapes and UTF-8


def test_a_string_without_max_length_takes_any_length():
    check({"type": "string"}, LONG_TEXT)
    check({"type": "string", "minLength": 300}, LONG_TEXT)
    assert not accepted({"type": "string", "minLength": 300}, json.dumps("x" * 299))


def test_max_length_still_holds_and_a_set_cap_still_caps():
    schema = {"type": "string", "maxLength": 300}
    check(schema, "y" * 300)
    assert not accepted(schema, json.dumps("y" * 301))
    assert accepted({"type": "string"}, json.dumps("z" * 10), max_string_length=10)
    assert not accepted({"type": "string"}, json.dumps("z" * 11), max_string_length=10)


def test_arrays_and_maps_without_a_bound_take_any_count():
    check({"type": "array", "items": {"type": "integer"}}, list(range(-50, 50)))
    check({"type": "array", "items": {"type": "array", "items": {"type": "string"}}}, [["ab"] * 30] * 30)
    check({"type": "object", "additionalProperties": {"type": "boolean"}}, {f"k{i}": i % 2 == 0 for i in range(40)})
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 20}
    check(schema, list(range(20)))
    assert not accepted(schema, json.dumps(list(range(21)), separators=(",", ":")))


@pytest.mark.parametrize("pattern, value", [
    ("^[a-z]+$", "q" * 500),
    ("^(ab|cd)*$", "abcd" * 120),
    ("^x\\d+", "x" + "7" * 400 + " then anything: " + LONG_TEXT[:200]),
    ("^v[0-9]+(\\.[0-9]+)*$", "v1" + ".22" * 150),
])
def test_pattern_repeats_have_no_cap(pattern, value):
    check({"type": "string", "pattern": pattern}, value)


def _states(schema: dict) -> int:
    return build_node_automaton(schema_node(schema, SchemaOptions())).num_states


def test_a_loop_costs_one_copy_of_its_item():
    """Each level of nesting adds the same few states: the item is written once, not once per count left."""
    def nested(depth: int) -> dict:
        schema = {"type": "object", "properties": {"n": {"type": "number"}, "s": {"type": "string"}},
                  "required": ["n"]}
        for _ in range(depth):
            schema = {"type": "array", "items": schema}
        return schema
    sizes = [_states(nested(d)) for d in range(1, 6)]
    steps = {b - a for a, b in zip(sizes, sizes[1:])}
    assert len(steps) == 1 and steps.pop() < 20, sizes
    check(nested(4), [[[[{"n": 1.5, "s": "x"}] * 3] * 3] * 3] * 3)


def test_an_enum_beside_a_free_string_is_the_free_string():
    """anyOf [enum, {minLength: 1}]: the enum's values are strings the other branch takes (dropped: the same
    language), so the automaton is the plain string's, not the enum's text open beside the string's body."""
    values = ["checkstyle", "codeFrame", "json", "junit", "prose", "stylish", "verbose"]
    both = {"type": "string", "anyOf": [{"enum": values}, {"minLength": 1}]}
    plain = {"type": "string", "minLength": 1}
    assert _states(both) == _states(plain)
    for v in values + ["other", LONG_TEXT]:
        check(both, v)
    assert not accepted(both, '""')
    # an enum value the other branch refuses stays
    short = {"anyOf": [{"enum": ["a much longer value"]}, {"type": "string", "maxLength": 3}]}
    check(short, "a much longer value")
    check(short, "abc")
    assert not accepted(short, '"abcd"')


def test_numbers_take_any_number_of_digits():
    """No digit cap (int_digits, fraction_digits, exponent_digits None): 40-digit values through the table."""
    check({"type": "integer", "minimum": 0}, 10 ** 40 + 7)
    check({"type": "array", "items": {"type": "integer", "maximum": -3}}, [-(10 ** 39), -3, -4])
    assert not accepted({"type": "integer", "minimum": 0}, "-" + "9" * 40)
    s = {"type": "number", "minimum": 1.5}
    assert accepted(s, "1.5" + "0" * 40 + "1") and accepted(s, "9" * 40 + "." + "1" * 40)
    assert not accepted(s, "1.4" + "9" * 40)
    assert accepted({"type": "number"}, "-12345678901234567890123.25e-1234567890")
    assert not accepted({"type": "integer"}, "1234", int_digits=3)



NULLABLE_LOOPS = [("^(a?b?)*c$", "ab" * 30 + "c"), ("^(?:x|y?)+$", "xy" * 30), ("^((ab)?c?)*$", "abc" * 20),
                  ("^(a*)*b$", "a" * 60 + "b"), ("^(a?){3,}b$", "a" * 40 + "b"), ("^(?:(?:)|a{0,2})*$", "a" * 41)]


@pytest.mark.parametrize("pattern, long", NULLABLE_LOOPS)
def test_a_loop_of_an_item_that_may_be_empty_has_no_cap(pattern, long):
    """`(a?)*` loops as `a*` (schema/regex.py without_empty), with no cap: the node tree takes a text iff Python's
    re takes it, far past the old 16 repetitions, and the longest text re takes is walked through the table."""
    schema = {"type": "string", "pattern": pattern}
    rx, body = compile_regex(schema_node(schema)), re.compile(pattern[1:-1])
    rng = random.Random(pattern)
    # short texts: a nested loop backtracks exponentially in re on a text it refuses
    texts = ["", "c"] + ["".join(rng.choice("abcxy") for _ in range(rng.randint(0, 12))) for _ in range(300)]
    for s in texts:
        assert bool(rx.fullmatch(json_literal(s))) == bool(body.fullmatch(s)), (pattern, s)
    check(schema, long)                                                                 # past 16 repetitions
