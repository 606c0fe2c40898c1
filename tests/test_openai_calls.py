"""OpenAI-shaped tool calls (batchmask.tools.calls) against OpenAI's documented call object, json.loads and the
formats' own writing of several calls."""
from __future__ import annotations

import hashlib
import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchmask.tools.calls import call_id, parse_calls, parse_reply, tool_call
from batchmask.tools.envelope import ENVELOPES
from batchmask.tools.registry import ToolRegistry

# OpenAI's ChatCompletionMessageToolCall (type "function"), as its API reference documents it.
OPENAI_TOOL_CALL = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "type": {"const": "function"},
        "function": {"type": "object",
                     "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
                     "required": ["name", "arguments"], "additionalProperties": False},
    },
    "required": ["id", "type", "function"], "additionalProperties": False,
}

TYPED = ToolRegistry.from_obj([{"type": "function", "function": {
    "name": "get_weather", "description": "weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}])

json_args = st.dictionaries(st.text(min_size=1, max_size=5),
                            st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.none()), max_size=4)


@settings(max_examples=100, deadline=None)
@given(name=st.text(min_size=1, max_size=10), args=json_args, rid=st.text(max_size=10), i=st.integers(0, 50))
def test_tool_call_has_openai_shape(name, args, rid, i):
    call = tool_call(name, args, call_id(rid, i))
    jsonschema.validate(call, OPENAI_TOOL_CALL)
    assert json.loads(call["function"]["arguments"]) == args
    assert call["id"] == "call_" + hashlib.sha256(f"{rid}:{i}".encode()).hexdigest()[:24]


def test_ids_stable_and_distinct():
    assert call_id("task-7", 0) == call_id("task-7", 0)
    ids = {call_id(r, i) for r in ("a", "b", "task-7") for i in range(20)}
    assert len(ids) == 60


def test_tool_call_refuses_bad_input():
    with pytest.raises(ValueError, match="non-empty string name"):
        tool_call("", {}, "call_x")
    with pytest.raises(ValueError, match="arguments must be an object"):
        tool_call("f", [1], "call_x")


@pytest.mark.parametrize("fmt", sorted(ENVELOPES))
def test_one_call_each_format(fmt):
    env = ENVELOPES[fmt]
    text = env.render("get_weather", {"city": "Paris", "days": 3})
    [[call]] = parse_calls([text], TYPED, format=fmt, request_ids=["r1"])
    jsonschema.validate(call, OPENAI_TOOL_CALL)
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3}
    assert call["id"] == call_id("r1", 0)


@pytest.mark.parametrize("fmt", sorted(ENVELOPES))
def test_several_calls_each_format(fmt):
    env = ENVELOPES[fmt]
    calls = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo", "days": 2})]
    if env.prefix:   # hermes: blocks one after another, newline between (as Qwen2.5's template writes them)
        text = "\n".join(env.render(n, a) for n, a in calls)
    else:
        text = json.dumps([{env.name_key: n, env.args_key: a} for n, a in calls])
    [got] = parse_calls([text], TYPED, format=fmt)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert [c["id"] for c in got] == [call_id(0, 0), call_id(0, 1)]


def test_hermes_suffix_inside_a_string_argument():
    env = ENVELOPES["hermes"]
    text = env.render("get_weather", {"city": "a\n</tool_call>b"})
    [[call]] = parse_calls([text], TYPED, format="hermes")
    assert json.loads(call["function"]["arguments"]) == {"city": "a\n</tool_call>b"}


@pytest.mark.parametrize("text, why", [
    ('{"name":"nope","arguments":{}}', "unknown tool"),
    ('{"name":"get_weather","arguments":{"days":1}}', "arguments"),
    ('[]', "at least one call"),
    ('[{"name":"get_weather","arguments":{"city":"x"}},{"name":"get_weather","arguments":{}}]', "call 1"),
    ('{"name":"get_weather","name":"x","arguments":{}}', "repeated"),
    ('plain words', "not JSON"),
])
def test_not_a_call_gives_no_calls_and_a_reason(text, why):
    content, calls, reason = parse_reply(text, TYPED, "json")
    assert content is None and calls == [] and why in reason
    assert parse_calls([text], TYPED) == [[]]


def test_seed_answer_is_content_not_a_call():
    reg = ToolRegistry.defaults()
    text = ENVELOPES["seed"].render("answer", {"text": "hello"})
    assert parse_reply(text, reg, "seed") == ("hello", [], None)
    calc = ENVELOPES["seed"].render("calc", {"expr": "1+2"})
    [[call]] = parse_calls([calc], reg, format="seed")
    assert call["function"] == {"name": "calc", "arguments": '{"expr":"1+2"}'}


def test_request_ids_must_match_texts():
    with pytest.raises(ValueError, match="2 texts but 1 request ids"):
        parse_calls(["a", "b"], TYPED, request_ids=["x"])
