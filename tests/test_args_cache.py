"""Typed tools' argument nodes are kept per (parameters, options, separators): a kept node is the one a
fresh build gives, and a change to any part of the key builds anew."""
from __future__ import annotations

import json

import pytest
from data_paths import CATALOGUE

from batchmask.schema.build import SchemaError, SchemaOptions, schema_node
from batchmask.tools import envelope
from batchmask.tools.envelope import get_envelope, registry_node
from batchmask.tools.registry import Tool, ToolRegistry


def fresh(tool: Tool, fmt: str, options: SchemaOptions):
    return schema_node(tool.parameters, options, separators=get_envelope(fmt).separators)


def test_kept_nodes_equal_fresh_builds():
    reg = ToolRegistry.from_json(str(CATALOGUE))
    typed = [t for t in reg if t.parameters is not None]
    envelope._ARGS_CACHE.clear()
    for fmt in ("json", "llama3"):
        for opts in (SchemaOptions(), SchemaOptions(max_string_length=9)):
            first, again = registry_node(reg, fmt, 256, opts), registry_node(reg, fmt, 256, opts)
            assert first == again
            for t in typed:
                assert envelope.args_node(t, get_envelope(fmt), 256, opts) == fresh(t, fmt, opts)
    assert len(envelope._ARGS_CACHE) == 4 * len(typed)


def test_changed_parameters_build_anew_and_errors_are_not_kept():
    params = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 5}}, "required": ["n"]}
    tool = Tool("t", "", parameters=params)
    env, opts = get_envelope("json"), SchemaOptions()
    a = envelope.args_node(tool, env, 256, opts)
    params["properties"]["n"]["maximum"] = 7                       # the same dict, now another schema
    b = envelope.args_node(tool, env, 256, opts)
    assert a != b and b == fresh(tool, "json", opts)
    one = Tool("t", "", parameters=json.loads('{"const": 1}'))
    one_f = Tool("t", "", parameters=json.loads('{"const": 1.0}'))     # equal in Python, another JSON text
    assert envelope.args_node(one_f, env, 256, opts) == fresh(one_f, "json", opts)
    assert envelope.args_node(one, env, 256, opts) == fresh(one, "json", opts)
    bad = Tool("t", "", parameters={"type": "integer", "minimum": 3, "maximum": 1})
    n = len(envelope._ARGS_CACHE)
    for _ in range(2):
        with pytest.raises(SchemaError):
            envelope.args_node(bad, env, 256, opts)
    assert len(envelope._ARGS_CACHE) == n


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(envelope, "ARGS_CACHE_SIZE", 3)
    env, opts = get_envelope("json"), SchemaOptions()
    for k in range(6):
        envelope.args_node(Tool("t", "", parameters={"type": "integer", "maximum": k}), env, 256, opts)
    assert len(envelope._ARGS_CACHE) == 3
