"""Envelopes (call formats), the call parser and the validator (jsonschema, closed objects), against references.

The validator is checked against jsonschema (format checker on) on generated schemas and values;
the envelope's render/parse against json.dumps/json.loads.
"""
from __future__ import annotations

import json
from decimal import Decimal
from types import SimpleNamespace

import jsonschema
import pytest
from data_paths import data_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_strategies import FORMAT_SAMPLES, closed, json_values, schemas

from batchmask.grammar.nodes import Alt, Lit, Str, tool_path
from batchmask.schema.validate import check, loads
from batchmask.tools.envelope import ENVELOPES, CallError, Envelope, call_schema, get_envelope, registry_node
from batchmask.tools.prompt import parse_call, render_call
from batchmask.tools.registry import Tool, ToolArg, ToolRegistry

CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER     # (FormatChecker() would mix in draft 3's time)


def reference_valid(value, schema) -> bool:
    return jsonschema.Draft202012Validator(closed(schema), format_checker=CHECKER).is_valid(value)


# --- the validator against jsonschema --------------------------------------------------------------
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas(), value=json_values())
def test_validator_agrees_with_jsonschema(schema, value):
    text = json.dumps(value, ensure_ascii=False)
    ours = check(loads(text), schema) is None
    assert ours == reference_valid(json.loads(text), schema), (schema, text, check(loads(text), schema))


@pytest.mark.parametrize("fmt", ["date", "time", "date-time", "uuid"])
def test_validator_formats_agree_with_jsonschema(fmt):
    schema = {"type": "string", "format": fmt}
    for s in FORMAT_SAMPLES:
        assert (check(s, schema) is None) == reference_valid(s, schema), (fmt, s)


def test_validator_numbers_are_exact():
    schema = {"type": "number", "exclusiveMaximum": 30}
    assert check(loads("29.9999999999999999999"), schema) is None        # a float would round it to 30.0
    assert check(loads("30"), schema) is not None
    assert check(loads("3.0"), {"type": "integer"}) is None              # JSON Schema: an integer value
    assert check(True, {"type": "integer"}) is not None                  # a boolean is not a number
    assert check(Decimal("1"), {"enum": [True]}) is not None
    assert check(loads("0.001"), {"enum": [0.001]}) is None                # a float bound: the decimal written


def test_validator_reasons_name_the_pointer():
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer", "maximum": 3}}}}
    assert check(loads('{"a":[1,7]}'), schema).startswith("#/a/1: 7 ")
    assert "'b' was unexpected" in check(loads('{"b":1}'), schema)           # closed: only declared properties
    assert check(loads('{"b":1}'), schema, closed=False) is None             # the specification's open reading


# --- envelopes ---------------------------------------------------------------------------------------
ARGS = st.dictionaries(st.text(alphabet='ab"\\é', min_size=1, max_size=3),
                       st.one_of(st.text(max_size=5), st.integers(), st.booleans(), st.none()), max_size=3)


@settings(max_examples=100, deadline=None)
@given(fmt=st.sampled_from(sorted(ENVELOPES)), name=st.text(alphabet="ab_é", min_size=1, max_size=5), args=ARGS,
       seps=st.sampled_from([(",", ":"), (", ", ": ")]),
       wrap=st.sampled_from([("", ""), ("<tool_call>\n", "\n</tool_call>")]))
def test_envelope_render_is_json_dumps_and_parse_inverts_it(fmt, name, args, seps, wrap):
    base = get_envelope(fmt)
    env = Envelope(base.format, base.name_key, base.args_key, seps, *wrap)
    text = env.render(name, args)
    body = json.dumps({base.name_key: name, base.args_key: args}, separators=seps, ensure_ascii=False)
    assert text == wrap[0] + body + wrap[1]
    assert env.parse(text) == (name, args)
    # the head and tail the grammar writes are the text around the arguments object
    inner = json.dumps(args, separators=seps, ensure_ascii=False)
    assert (env.head(name) + inner.encode() + env.tail()).decode() == text


@pytest.mark.parametrize("text,why", [
    ('{"name":"calc"}', "exactly the keys"),
    ('{"name":"calc","arguments":{},"x":1}', "exactly the keys"),
    ('{"name":"calc","name":"calc","arguments":{}}', "repeated"),
    ('{"name":"calc","arguments":{"expr":NaN}}', "NaN"),
    ('{"name":"calc","arguments":', "not JSON"),
])
def test_envelope_parse_refuses(text, why):
    with pytest.raises(CallError, match=why):
        get_envelope("json").parse(text)


def test_unknown_format_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown call format 'yaml'.*seed, json"):
        get_envelope("yaml")


def test_native_registry_node_is_the_seed_path_in_both_formats():
    reg = ToolRegistry([Tool("calc", "", (ToolArg("expr"), ToolArg("unit", required=False), ToolArg("to")))])
    node = registry_node(reg, "seed", max_string=9)
    assert isinstance(node, Alt)
    assert [opt.items for opt in node.options] == [tool_path(t.name, [a.name for a in t.required_args], 9)
                                                   for t in reg]
    json_node = registry_node(reg, "json", max_string=9)        # the user's tools: the built-in answer is seed's
    assert len(json_node.options) == 1
    json_calc = json_node.options[0]
    assert json_calc.items == (Lit(b'{"name":"calc","arguments":{"expr":"'), Str(1, 9), Lit(b'","to":"'), Str(1, 9),
                               Lit(b'"}}'))


# --- parse_call ------------------------------------------------------------------------------------
def test_parse_call_seed_format_is_unchanged():
    reg = ToolRegistry.defaults()
    assert parse_call('{"tool":"calc","args":{"expr":"1+2"}}', reg) == ({"tool": "calc", "args": {"expr": "1+2"}},
                                                                        None)
    assert parse_call('{"tool":"calc","args":{"expr":""}}', reg)[1] == "arg 'expr' must be a non-empty string"
    assert parse_call('{"tool":"nope","args":{}}', reg)[1] == "unknown tool 'nope'"
    assert parse_call('{"name":"calc","arguments":{"expr":"1"}}', reg)[0] is None       # the other format
    assert parse_call('{"name":"calc","arguments":{"expr":"1"}}', reg, format="json")[0] == {
        "name": "calc", "arguments": {"expr": "1"}}
    assert render_call("calc", {"expr": "1"}, format="json") == '{"name":"calc","arguments":{"expr":"1"}}'


def _typed_registry():
    tools = json.loads((data_dir("tools") / "agent_tools.json").read_text())
    try:
        return ToolRegistry.from_obj(tools, source="agent_tools.json")
    except Exception as e:          # the typed registry lands with batchmask/schema/build.py
        pytest.skip(f"typed registries not available yet: {e}")


def test_parse_call_typed_tools_checks_the_schema():
    reg = _typed_registry()
    if not any(getattr(t, "parameters", None) for t in reg):
        pytest.skip("registry has no typed tools yet")
    ok = '{"name":"get_weather","arguments":{"location":"Paris","unit":"celsius"}}'
    assert parse_call(ok, reg, format="json") == (json.loads(ok), None)
    bad = '{"name":"get_weather","arguments":{"location":"Paris","unit":"kelvin"}}'
    call, why = parse_call(bad, reg, format="json")
    assert call is None and "/unit" in why and "kelvin" in why
    missing = '{"name":"search_web","arguments":{"num_results":3}}'
    assert "query" in parse_call(missing, reg, format="json")[1]
    # every accepted call is valid for jsonschema as well
    schema = call_schema(reg, "json")
    for text in (ok, '{"name":"book_flight","arguments":{"origin":"CDG","destination":"JFK","date":"2024-02-29",'
                     '"passengers":{"adults":2}}}'):
        call, why = parse_call(text, reg, format="json")
        assert why is None and reference_valid(call, schema)


# --- the compile entry points: bad input is one clear error ------------------------------------------
BYTES = SimpleNamespace(token_bytes=[b"", b"", b""] + [bytes([b]) for b in range(256)], eos_id=2, stop_ids=(2,))


@pytest.mark.parametrize("schema,match", [
    ("{nope", "<schema>: not valid JSON at line 1 column 2"),
    (["x"], "a JSON Schema is an object"),
    ({"type": "integer", "multipleOf": 3}, "#/multipleOf"),
])
def test_compile_json_schema_refuses_bad_schemas(schema, match):
    from batchmask import SchemaOptions, compile_json_schema
    with pytest.raises(ValueError, match=match):
        compile_json_schema(schema, BYTES, options=SchemaOptions(mode="strict"))


def test_compile_grammar_refuses_an_unknown_format_and_a_non_registry():
    from batchmask import compile_grammar
    with pytest.raises(ValueError, match="unknown call format 'xml'"):
        compile_grammar(ToolRegistry.defaults(), BYTES, format="xml")
    with pytest.raises(ValueError, match="needs a ToolRegistry"):
        compile_grammar([{"name": "calc"}], BYTES)


def test_compile_json_schema_accepts_a_json_string_and_writes_one_value():
    from batchmask import compile_json_schema
    g = compile_json_schema('{"type": "integer", "minimum": 3, "maximum": 4}', BYTES)
    state = g.start
    for b in b"4":
        state = int(g.next_state([state], [3 + b])[0])
    assert state >= 0 and bool(g.allowed([state])[0][2])          # the stop token after a whole value
    assert int(g.next_state([g.start], [3 + ord("5")])[0]) == -1


@pytest.mark.parametrize("fmt", sorted(ENVELOPES))
def test_a_call_with_an_integer_past_pythons_limit_parses(fmt):
    """An integer literal of 5000 digits (json.loads' int() raises past 4300) reads as an integral Decimal, the
    same number, instead of a ValueError escaping parse."""
    env = ENVELOPES[fmt]
    digits = "7" * 5000
    with pytest.raises(ValueError):
        json.loads(digits)
    name, args = env.parse(env.render("f", {"n": 1}).replace("1", digits))
    assert name == "f" and args == {"n": Decimal(digits)} and int(args["n"]) == 7 * (10 ** 5000 - 1) // 9
