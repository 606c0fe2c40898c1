"""Any JSON value (issue 24): a schema `true`, `{}` or without a type, and an array without `items`.

Walked token by token against llguidance, told the same bounds (tests/test_schema_oracle.any_schema: strings of
max_string_length, arrays and maps of max_items, any_depth levels of nesting); finished values validated with
jsonschema against the schema as written.
"""
from __future__ import annotations

import random

import pytest
from test_schema_oracle import matcher, validate_value, vocab, walk

from batchmask.api import compile_json_schema
from batchmask.schema.build import SchemaOptions, schema_node

ANY = [
    {"type": "object", "properties": {"x": {}}, "required": ["x"]},
    {"type": "object", "properties": {"meta": {"description": "anything"}, "n": {"type": "integer", "minimum": 0,
                                                                                 "maximum": 5}},
     "required": ["n", "meta"]},
    {"type": "array", "maxItems": 3},
    {"type": "object", "properties": {"v": True}, "required": ["v"]},
]


@pytest.mark.parametrize("schema", ANY, ids=range(len(ANY)))
@pytest.mark.parametrize("depth", [0, 1])
def test_any_value_matches_llguidance_and_validates(schema, depth):
    options = SchemaOptions(max_items=2, max_string_length=4, any_depth=depth)
    g = compile_json_schema(schema, vocab("gpt2"), options=options)
    rng = random.Random(11 + depth)
    for k in range(6):
        text = walk(g, matcher(schema, "gpt2", options), "gpt2", schema, options, rng, push=0.9 * (k % 2),
                    finish_at=rng.randint(0, 10))
        validate_value(text, schema)


def test_true_and_empty_schemas_are_the_same_any_value():
    assert schema_node(True) == schema_node({}) == schema_node({"title": "x", "x-note": 1})
    with pytest.raises(ValueError, match="any_depth must be an integer >= 0"):
        SchemaOptions(any_depth=-1)
