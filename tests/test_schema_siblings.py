"""Keywords beside anyOf / oneOf, and allOf's branches, are a conjunction (issue 24; batchmask/schema/siblings.py).

Each schema is compiled as written, siblings and all, and walked token by token against llguidance, which
reads the schema as the specification does (the siblings where they stand); every finished value is validated
with jsonschema against the schema as written. Where moving a sibling into a branch would not be exact (both
name keywords that read each other), the schema is still refused, naming the pointer.
"""
from __future__ import annotations

import re

import pytest
from test_schema_oracle import walks_agree

from batchmask.schema.base import SchemaError
from batchmask.schema.build import SchemaOptions, schema_node
from batchmask.schema.siblings import meet_types

STRICT = SchemaOptions(mode="strict")

SCHEMAS = [
    {"type": "string", "anyOf": [{"maxLength": 3}, {"pattern": "^[0-9]{2,5}$", "maxLength": 5}]},
    {"type": ["integer", "null"], "oneOf": [{"type": "integer", "minimum": 0, "maximum": 5}, {"type": "null"}]},
    {"maxLength": 4, "anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0, "maximum": 99}]},
    {"type": "number", "anyOf": [{"type": "integer", "minimum": -3, "maximum": 3}, {"type": "boolean"},
                                 {"minimum": 10, "maximum": 12}]},
    {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "n": {"type": "integer", "minimum": 0,
                                                                       "maximum": 9}},
     "required": ["k"], "anyOf": [{"required": ["n"]}, {"required": ["k"]}]},
    {"enum": ["x", "y", 1, None], "anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer"}]},
    # allOf: its branches and the keywords beside it as one schema
    {"type": "string", "allOf": [{"maxLength": 5}, {"minLength": 2}]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": [1, 2]}}},
               {"required": ["a"]}]},
    {"type": ["integer", "string"], "allOf": [{"type": "integer"}, {"minimum": 3, "maximum": 30}]},
    # a type beside a $ref whose target says it already (an object's: test_a_type_beside_a_ref_...)
    {"$defs": {"n": {"type": "integer", "minimum": -2, "maximum": 40}}, "type": ["number", "null"],
     "$ref": "#/$defs/n"},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: str(sorted(s))[:40])
def test_siblings_beside_a_union_match_llguidance_and_validate(schema):
    options = SchemaOptions()
    walks_agree(schema, options, seed=7, max_finish=6)


def test_siblings_that_read_a_branchs_keywords_merge_where_exact():
    """`properties` beside a branch's own `properties` join (neither side says which other keys it admits, so each
    is open and a value meets both); a second minLength takes the tighter. A second `pattern` cannot be one
    schema: strict refuses it, naming it."""
    a = {"type": "integer", "minimum": 0, "maximum": 1}
    schema = {"type": "object", "properties": {"a": a}, "anyOf": [{"properties": {"b": {"type": "boolean"}}},
                                                                  {"required": ["a"]}]}
    flat = {"anyOf": [{"type": "object", "properties": {"a": a, "b": {"type": "boolean"}}},
                      {"type": "object", "properties": {"a": a}, "required": ["a"]}]}
    assert schema_node(schema, STRICT) == schema_node(flat, STRICT)
    assert schema_node({"minLength": 2, "anyOf": [{"type": "string", "minLength": 1, "maxLength": 3}]}, STRICT) == \
        schema_node({"type": "string", "minLength": 2, "maxLength": 3}, STRICT)
    with pytest.raises(SchemaError, match=re.escape("'pattern' beside 'anyOf'")):
        schema_node({"pattern": "a", "anyOf": [{"type": "string", "pattern": "b"}]}, STRICT)


def test_types_meet_as_json_schema_reads_them():
    # an integer is a number; each side may be a name or a list
    cases = [("number", "integer", ["integer"]), (["integer", "null"], "number", ["integer"]),
             ("string", ["string", "null"], ["string"]), ("boolean", "null", []),
             (["number", "null"], "null", ["null"])]
    for a, b, want in cases:
        assert meet_types(a, b) == want and sorted(meet_types(b, a)) == sorted(want)


def test_a_type_beside_a_ref_to_an_object_schema_is_the_ref_alone():
    defs = {"o": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 3}},
                  "required": ["a"]}}
    assert schema_node({"$defs": defs, "type": "object", "$ref": "#/$defs/o"}) == \
        schema_node({"$defs": defs, "$ref": "#/$defs/o"})


def test_keywords_beside_a_ref_are_merged_with_its_target():
    """Draft 2020-12: a $ref and its siblings are a conjunction. The target and the siblings merge into one schema
    (a type that meets nothing is no value at all); what cannot merge (a second pattern) strict mode refuses."""
    defs = {"n": {"type": "integer", "minimum": 0, "maximum": 4}, "s": {"maxLength": 3}, "p": {"pattern": "^a"}}
    assert schema_node({"$defs": defs, "$ref": "#/$defs/s", "type": "string"}, STRICT) == \
        schema_node({"type": "string", "maxLength": 3}, STRICT)
    assert schema_node({"$defs": defs, "$ref": "#/$defs/n", "maxLength": 2}, STRICT) == \
        schema_node(defs["n"], STRICT)                   # maxLength says nothing of an integer
    with pytest.raises(SchemaError, match="no value satisfies the schema: no value meets both"):
        schema_node({"$defs": defs, "$ref": "#/$defs/n", "type": "string"}, STRICT)
    with pytest.raises(SchemaError, match="beside '\\$ref' is not supported"):
        schema_node({"$defs": defs, "$ref": "#/$defs/p", "type": "string", "pattern": "b"}, STRICT)


def test_a_format_json_schema_does_not_define_is_an_annotation():
    """`path`, `topic`, `int32` on a string: formats the specification does not define assert nothing (jsonschema
    ignores them too); a defined format the subset cannot write is still refused."""
    import jsonschema
    plain = {"type": "string", "maxLength": 5}
    for name in ("path", "topic", "int32", "datetime"):
        assert schema_node({**plain, "format": name}) == schema_node(plain)
        jsonschema.validate("a/b", {**plain, "format": name}, format_checker=jsonschema.FormatChecker())
    with pytest.raises(SchemaError, match="format 'idn-email' is not supported"):
        schema_node({**plain, "format": "idn-email"}, STRICT)


def test_all_of_objects_join_their_properties_unless_one_closes_itself():
    a = {"type": "object", "properties": {"a": {"type": "boolean"}}}
    b = {"type": "object", "properties": {"b": {"type": "boolean"}}}
    assert schema_node({"allOf": [a, b]}, STRICT) == \
        schema_node({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"}}}, STRICT)
    with pytest.raises(SchemaError, match="allOf branch 1 cannot be merged"):   # a's additionalProperties reads b
        schema_node({"allOf": [{**a, "additionalProperties": False}, b]}, STRICT)


def test_all_of_of_annotations_only_is_any_value():
    """JSON Schema Test Suite, allOf.json 'allOf with one empty schema': `allOf: [{}]` admits every value."""
    for branches in ([{}], [True], [{"description": "anything"}]):
        assert schema_node({"allOf": branches}) == schema_node(True)


def test_a_ref_is_percent_decoded_before_it_is_read_as_a_json_pointer():
    """A $ref is a URI fragment: percent-decoded, then a JSON pointer (RFC 6901 section 6); the suite's ref.json
    'escaped pointer ref' and 'refs with quote'."""
    defs = {"percent%field": {"type": "integer", "minimum": 0, "maximum": 3}, 'foo"bar': {"type": "boolean"},
            "slash/field": {"enum": ["x"]}}
    for ref, name in (("#/$defs/percent%25field", "percent%field"), ("#/$defs/foo%22bar", 'foo"bar'),
                      ("#/$defs/slash~1field", "slash/field"), ("#/$defs/slash%7E1field", "slash/field")):
        assert schema_node({"$defs": defs, "$ref": ref}) == schema_node(defs[name]), ref
    with pytest.raises(SchemaError, match="points at nothing"):
        schema_node({"$defs": defs, "$ref": "#/$defs/percent%2525field"})      # decoded once: percent%25field
