"""Strict and lenient modes, and the merges that make real schemas exact.

- allOf of $refs and a $ref with keywords beside it are merged into one schema: the language is checked token by
  token against llguidance (an independent engine reading the raw schema) and every finished value validates.
- Lenient mode (the default) compiles what strict mode refuses, as the nearest superset (or a narrowing), and
  says so: each relaxation is in the grammar's `relaxations` (kept in its cache file), one warning per keyword;
  a finished value outside the schema is caught by validation (jsonschema), naming the keyword.
"""
from __future__ import annotations

import warnings

import pytest
from test_schema_oracle import vocab, walks_agree

from batchmask.api import compile_json_schema
from batchmask.compiler.compiled import CompiledGrammar
from batchmask.errors import SchemaError
from batchmask.schema import base
from batchmask.schema.build import SchemaOptions, schema_node
from batchmask.schema.validate import check, loads

STRICT = SchemaOptions(mode="strict")
SMALL = SchemaOptions(mode="strict", max_string_length=6, max_items=3, int_digits=3)

# Kubernetes / JSON Schema Store shapes: composition through $ref, each beside the one schema it means, written
# out by hand (the reference llguidance reads: its own reading of allOf is open objects, ours closed).
NAME = {"type": "string", "maxLength": 4}
SIZE = {"type": "integer", "minimum": 0, "maximum": 20}
MERGED = [
    ({"allOf": [{"$ref": "#/$defs/named"}, {"$ref": "#/$defs/sized"}], "required": ["name"],
      "$defs": {"named": {"type": "object", "properties": {"name": NAME}}, "sized": {"properties": {"size": SIZE}}}},
     {"type": "object", "properties": {"name": NAME, "size": SIZE}, "required": ["name"]}),
    ({"type": "object", "properties": {"meta": {"$ref": "#/definitions/meta", "description": "the metadata",
                                                "type": "object", "required": ["uid"]}},
      "definitions": {"meta": {"type": "object", "properties": {"uid": {"type": "string", "maxLength": 3},
                                                                "tag": {"enum": ["a", "b"]}}}}},
     {"type": "object", "properties": {"meta": {"type": "object", "required": ["uid"], "properties": {
         "uid": {"type": "string", "maxLength": 3}, "tag": {"enum": ["a", "b"]}}}}}),
    ({"allOf": [{"type": "integer", "minimum": 2, "maximum": 40}, {"maximum": 9}, {"type": "number"}]},
     {"type": "integer", "minimum": 2, "maximum": 9}),
    ({"allOf": [{"properties": {"a": {"type": "integer", "maximum": 50}}},
                {"properties": {"a": {"minimum": 10}, "b": {"type": "boolean"}}, "required": ["a"]}],
      "type": "object"},
     {"type": "object", "required": ["a"],
      "properties": {"a": {"type": "integer", "minimum": 10, "maximum": 50}, "b": {"type": "boolean"}}}),
    ({"$ref": "#/$defs/s", "maxLength": 2, "$defs": {"s": {"type": "string", "maxLength": 5}}},
     {"type": "string", "maxLength": 2}),
    ({"allOf": [{"$ref": "#a"}], "$defs": {"x": {"$anchor": "a", "type": "array", "items": {"enum": [1, 2]}}}},
     {"type": "array", "items": {"enum": [1, 2]}}),
]


@pytest.mark.parametrize("composed,flat", MERGED, ids=range(len(MERGED)))
def test_merged_compositions_are_the_schema_they_mean(composed, flat):
    """The composed schema compiles, exactly (no relaxation), to the language of the flat one, whose walks agree
    with llguidance token by token; the composed schema's walks validate against the composed schema itself."""
    from batchmask.schema.nodes import node_accepts
    assert _relaxations(composed, STRICT) == []
    walks_agree(flat, SMALL, walks=4)
    ours, theirs = compile_json_schema(composed, vocab("gpt2"), options=SMALL), schema_node(flat, SMALL)
    rng = __import__("random").Random(0)
    for _ in range(20):                                   # random values of the composed grammar: in the flat one
        text = _random_value(ours, rng)
        assert node_accepts(theirs, text), text
        assert check(loads(text.decode()), composed) is None, text


def _random_value(g, rng, steps: int = 60) -> bytes:
    """A random finished value of grammar `g`: legal tokens drawn at random, then the shortest completion."""
    import torch
    state, out = g.start, b""
    for _ in range(rng.randrange(steps)):
        legal = torch.nonzero(g.class_next[state][g.token_class.long()] >= 0).flatten().tolist()
        legal = [t for t in legal if t not in g.stop_ids]
        if not legal:
            break
        tok = rng.choice(legal)
        state, out = int(g.next_state([state], [tok])[0]), out + g.token_bytes[tok]
    return out + g.finish_bytes(state)


def test_a_merge_that_is_not_exact_is_left_to_the_mode():
    two_patterns = {"allOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "b$"}]}
    with pytest.raises(SchemaError, match=r"#/allOf/1: allOf branch 1 cannot be merged .*\(strict mode"):
        schema_node(two_patterns, STRICT)
    got = _relaxations(two_patterns, SchemaOptions())
    assert [(r.keyword, r.ptr, r.kind) for r in got] == [("allOf", "#/allOf/1", base.SUPERSET)]
    closed = {"allOf": [{"type": "object", "properties": {"a": {"type": "null"}}, "additionalProperties": False},
                        {"properties": {"b": {"type": "null"}}}]}
    with pytest.raises(SchemaError, match="cannot be merged"):      # additionalProperties reads the other side
        schema_node(closed, STRICT)


# --- lenient mode ------------------------------------------------------------------------------------------
def test_lenient_grammar_reports_its_relaxations_and_validation_catches_what_they_let_through(tmp_path):
    schema = {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 2, "maxItems": 2, "uniqueItems": True}
    with pytest.raises(SchemaError, match=r"#/uniqueItems: 'uniqueItems': true is not supported"):
        compile_json_schema(schema, vocab("gpt2"), options=STRICT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        base._WARNED.discard("uniqueItems")
        g = compile_json_schema(schema, vocab("gpt2"))
        compile_json_schema(schema, vocab("gpt2"))                  # the same keyword again: no second warning
    said = [w for w in caught if issubclass(w.category, base.LenientWarning)]
    assert len(said) == 1 and "#/uniqueItems" in str(said[0].message), [str(w.message) for w in caught]
    assert g.relaxations == [{"where": "<schema>", "pointer": "#/uniqueItems", "keyword": "uniqueItems",
                              "kind": "superset", "effect": base.RELAXED["uniqueItems"][1]}]
    path = tmp_path / "g.bmg"
    g.save(path)
    assert CompiledGrammar.load(path, tokenizer=vocab("gpt2")).relaxations == g.relaxations
    # the superset holds ["x","x"]: the grammar admits it, validation names the keyword's failure
    ids = {b: i for i, b in enumerate(g.token_bytes)}
    state = g.start
    for ch in '["x","x"]':
        state = int(g.next_state([state], [ids[ch.encode()]])[0])
        assert state >= 0
    assert bool(g.final[state])
    assert "non-unique" in check(loads('["x","x"]'), schema)
    assert check(loads('["x","y"]'), schema) is None


def test_each_relaxed_keyword_keeps_every_valid_value():
    """Superset relaxations drop a constraint: a value valid under the schema is still in the language (checked
    on bytes); narrowing ones may drop values but write only valid ones."""
    from batchmask.schema.nodes import node_accepts
    cases = [({"type": "integer", "minimum": 0, "maximum": 99, "multipleOf": 7}, ["0", "14", "98"]),
             ({"type": "string", "maxLength": 3, "not": {"const": "a"}}, ['"b"', '""']),
             ({"type": "object", "properties": {"a": {"type": "null"}}, "minProperties": 1}, ['{"a":null}']),
             ({"oneOf": [{"type": "integer", "maximum": 5}, {"type": "integer", "minimum": 3, "maximum": 9}]},
              ["1", "8"]),
             ({"type": "string", "pattern": "(?=x)xy", "maxLength": 4}, ['"xy"']),
             ({"type": "array", "items": {"type": "integer", "maximum": 3}, "maxItems": 2, "contains": {"const": 1}},
              ["[1]", "[0,1]"])]
    for schema, valid in cases:
        node = schema_node(schema, SchemaOptions(int_digits=3))
        for text in valid:
            assert check(loads(text), schema) is None, (schema, text)
            assert node_accepts(node, text.encode()), (schema, text)


def test_mode_is_checked_and_part_of_the_grammar_key():
    from batchmask.api import schema_grammar_key
    with pytest.raises(ValueError, match="SchemaOptions.mode must be one of lenient, strict"):
        SchemaOptions(mode="loose")
    s = {"type": "string"}
    assert schema_grammar_key(s, STRICT) != schema_grammar_key(s, SchemaOptions())


def _relaxations(schema, options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with base.collect() as got:
            schema_node(schema, options)
    return got


# --- the command line ----------------------------------------------------------------------------------------
def test_compile_command_follows_schema_mode(tmp_path, capsys):
    import json

    from batchmask.run.cli import main
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "required": ["tags"],
        "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}}}}}]))
    assert main(["compile", "--tools", str(tools), "--format", "json", "--schema-mode", "strict"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "#/properties/tags/uniqueItems" in err[0] and "strict mode" in err[0], err
    base._WARNED.discard("uniqueItems")
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        assert main(["compile", "--tools", str(tools), "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert "batchmask: warning: " in err and "#/properties/tags/uniqueItems: 'uniqueItems'" in err, err


def test_a_finished_call_outside_the_schema_is_recorded_invalid_naming_why():
    """What a run does with each finished call (batchmask.tools.prompt.parse_call): a lenient superset's value that
    the schema refuses comes back as an error naming the pointer and the keyword's failure, not as a call."""
    from batchmask.tools.prompt import parse_call
    from batchmask.tools.registry import ToolRegistry
    registry = ToolRegistry.from_obj([{"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "required": ["tags"],
        "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}}}}}])
    call, why = parse_call('{"name":"tag","arguments":{"tags":["a","a"]}}', registry, format="json")
    assert call is None and "tool 'tag', arguments at #/tags: " in why and "non-unique" in why, why
    call, why = parse_call('{"name":"tag","arguments":{"tags":["a","b"]}}', registry, format="json")
    assert why is None and call["arguments"] == {"tags": ["a", "b"]}


def test_open_objects_reach_the_grammar_the_call_check_and_the_grammar_file_check(tmp_path, capsys):
    """--open-objects (SchemaOptions.open_objects): the compiled grammar takes a key the schema does not declare,
    parse_call validates such a call openly (jsonschema: the schema as written), and a --grammar file compiled
    without the flag is refused by a run with it, naming the flag."""
    import json

    from batchmask.run.cli import main
    from batchmask.run.cli_format import Parser
    from batchmask.run.cli_grammar import GrammarFile, schema_args
    from batchmask.schema.build import SchemaOptions
    from batchmask.tools.prompt import parse_call
    from batchmask.tools.registry import ToolRegistry
    entries = [{"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "required": ["t"], "properties": {"t": {"type": "string"}}}}}]
    extra = '{"name":"tag","arguments":{"t":"x","zz":1}}'
    closed, opened = ToolRegistry.from_obj(entries), ToolRegistry.from_obj(entries, options=SchemaOptions(
        open_objects=True))
    assert parse_call(extra, closed, format="json")[0] is None
    assert parse_call(extra, opened, format="json") == ({"name": "tag", "arguments": {"t": "x", "zz": 1}}, None)
    from batchmask.api import call_node
    from batchmask.schema.nodes import node_accepts
    assert node_accepts(call_node(opened, "json", 256, SchemaOptions(open_objects=True)), extra.encode())
    assert not node_accepts(call_node(closed, "json", 256, SchemaOptions()), extra.encode())
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(entries))
    out = tmp_path / "g.pt"
    assert main(["compile", "--tools", str(tools), "--format", "json", "--out", str(out)]) == 0
    capsys.readouterr()
    p = Parser(prog="t")
    schema_args(p)
    p.add_argument("--format")
    p.add_argument("--bytes", action="store_true")
    p.add_argument("--max-string", type=int, default=256)
    args = p.parse_args(["--format", "json", "--open-objects"])
    with pytest.raises(ValueError, match="compiled without --open-objects, this run has --open-objects"):
        GrammarFile.read(out).check_flags(opened, args)
