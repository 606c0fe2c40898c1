"""Any JSON value (issue 24): a schema `true`, `{}` or without a type, and an array without `items`.

Walked token by token against llguidance, told the same bounds (tests/test_schema_oracle.any_schema: strings of
max_string_length, arrays and maps of max_items, any_depth levels of nesting); finished values validated with
jsonschema against the schema as written.
"""
from __future__ import annotations

import pytest
from test_schema_oracle import walks_agree

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
    walks_agree(schema, options, seed=11 + depth, max_finish=10)


def test_true_and_empty_schemas_are_the_same_any_value():
    assert schema_node(True) == schema_node({}) == schema_node({"title": "x", "x-note": 1})
    with pytest.raises(ValueError, match="any_depth must be an integer >= 0"):
        SchemaOptions(any_depth=-1)
