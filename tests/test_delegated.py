"""Moves read from a block cell's row (table/delegated.py) against the full trie walk they replace.

An explicit state beside one block position (a pattern's `(...)+` beside the string's end, an enum beside a free
string, a URI's path) takes the tokens that start with the cell's bytes from the cell's row. The reference is the
table built with those moves walked token by token from the state, as before: the same automaton with its
delegates removed. Every table tensor must be equal, on Llama 2's and Qwen2's vocabularies.
"""
from __future__ import annotations

import dataclasses
from functools import cache

import pytest
import torch
from data_paths import LLAMA2, QWEN2, needs_qwen2

from batchmask.automaton.tree import build_node_automaton
from batchmask.compiler.compiled import _compile
from batchmask.schema.build import SchemaOptions, schema_node

PATH = "^/(([a-zA-Z0-9._~!$&'()*+,;=:@-]|%[0-9a-fA-F]{2})+(/([a-zA-Z0-9._~!$&'()*+,;=:@-]|%[0-9a-fA-F]{2})*)*)?$"
SCHEMAS = {
    "path pattern in many places": {
        "type": "object", "properties": {k: {"type": "string", "pattern": PATH} for k in ("a", "b", "base_path")},
        "required": ["a"], "additionalProperties": False},
    "array of path patterns": {"type": "array", "items": {"type": "string", "pattern": PATH}, "maxItems": 3},
    "enum beside a free string": {"anyOf": [{"enum": ["PUBLIC", "PRIVATE", "x"]},
                                            {"type": "string", "pattern": "^[A-Z][a-z]*$"}]},
    "word then more": {"type": "string", "pattern": "^[a-z]+(-[a-z0-9]+)*$"},
    "uri and hostname": {"type": "object", "properties": {"u": {"type": "string", "format": "uri"},
                                                          "h": {"type": "string", "format": "hostname"}}},
    "hostname labels": {"type": "array", "items": {"type": "string", "format": "hostname"}, "maxItems": 2},
    "free string or number": {"type": "array", "items": {"anyOf": [{"type": "string", "minLength": 2},
                                                                  {"type": "integer"}]}},
}
FIELDS = ("token_class", "state_row", "row_next", "row_legal", "row_final", "targets", "segment_start",
          "segment_base")


@cache
def tokenizer(which: str):
    from batchmask.models.tokenizer import load_tokenizer
    return load_tokenizer(LLAMA2 / "tokenizer.model" if which == "llama2" else QWEN2 / "tokenizer.json")


def both_tables(schema: dict, tok):
    node = schema_node(schema, SchemaOptions())
    aut = build_node_automaton(node)
    walked = dataclasses.replace(aut, edge_cell=None)
    key = {"test": "delegated"}
    return aut, _compile(node, tok, True, key, "cpu", aut), _compile(node, tok, True, key, "cpu", walked)


@pytest.mark.parametrize("which", ["llama2", pytest.param("qwen2", marks=needs_qwen2)])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_moves_read_from_the_cell_are_the_walked_moves(name, which):
    aut, read, walked = both_tables(SCHEMAS[name], tokenizer(which))
    for f in FIELDS:
        assert torch.equal(getattr(read, f), getattr(walked, f)), f
    assert read.num_states == walked.num_states


def test_the_states_that_read_from_a_cell_are_found():
    """Not vacuous: the schemas above do have states whose moves are read from a cell, and many of their edges."""
    for name in ("path pattern in many places", "enum beside a free string", "uri and hostname", "hostname labels"):
        aut = build_node_automaton(schema_node(SCHEMAS[name], SchemaOptions()))
        cells = aut.edge_cell[aut.edge_cell >= 0]
        assert len(cells) >= 26, name
        assert all(any(b.base <= c < b.base + b.size for b in aut.blocks) for c in set(cells.tolist()))
