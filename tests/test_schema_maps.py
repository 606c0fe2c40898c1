"""Objects of free keys (issue 24): `additionalProperties` as a schema without `properties`.

Each map schema is walked token by token against llguidance, told the same caps (at most max_items entries,
keys of at most max_string_length characters); every finished value is validated with jsonschema.
"""
from __future__ import annotations

import pytest
from test_schema_oracle import walks_agree

from batchmask.schema.build import SchemaOptions, schema_node

MAPS = [
    {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 99}},
    {"type": "object", "additionalProperties": {"type": "string", "maxLength": 4}},
    {"type": "object", "additionalProperties": {"type": "object", "properties": {"on": {"type": "boolean"}},
                                                "required": ["on"]}},
    {"type": "object", "properties": {"tags": {"type": "object", "additionalProperties": {"enum": ["a", "b"]}}},
     "required": ["tags"]},
]


@pytest.mark.parametrize("schema", MAPS, ids=range(len(MAPS)))
def test_maps_match_llguidance_and_validate(schema):
    options = SchemaOptions(max_items=3, max_string_length=6)
    walks_agree(schema, options, seed=3, max_finish=10)


def test_a_map_whose_values_admit_nothing_is_the_empty_object():
    assert schema_node({"type": "object", "additionalProperties": False}) == \
        schema_node({"type": "object", "additionalProperties": {"type": "integer", "minimum": 2, "maximum": 1}})
