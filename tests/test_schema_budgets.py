"""What a schema too large to write out gets: lenient mode stops counting maxItems of large items (a superset it
reports), and an automaton past its size limits is refused in about a second with a one-line error, not built
until memory runs out (JSONSchemaBench Github_hard o9916: 260 million cells, an OOM kill before the limit).

The references: jsonschema (an array longer than maxItems is invalid, and lenient mode's output reports it) and
the node tree itself (`node_accepts` reads the language without the automaton).
"""
from __future__ import annotations

import json
import warnings

import pytest

from batchmask.automaton import layout
from batchmask.automaton.nfa import GrammarBuildError
from batchmask.automaton.tree import build_node_automaton
from batchmask.grammar.nodes import Repeat
from batchmask.schema import base
from batchmask.schema.build import SchemaOptions, schema_node
from batchmask.schema.nodes import alt, lit, node_accepts, seq, unfolds_within
from batchmask.schema.validate import check

WIDE = {"type": "object", "additionalProperties": False, "required": ["k0"],
        "properties": {f"k{i}": {"enum": [f"v{i}-{j}" for j in range(20)]} for i in range(80)}}
ARRAY = {"type": "array", "items": WIDE, "maxItems": 1000}


def _node(schema, options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with base.collect() as got:
            node = schema_node(schema, options)
    return node, got


def test_lenient_mode_stops_counting_large_items_and_says_so():
    node, relaxed = _node(ARRAY, SchemaOptions())
    assert [(r.ptr, r.keyword, r.kind) for r in relaxed] == [("#/maxItems", "maxItems", base.SUPERSET)]
    item = json.dumps({"k0": "v0-3"}, separators=(",", ":"))
    text = ("[" + ",".join([item] * 1001) + "]").encode()
    assert node_accepts(node, text)                              # the superset: 1001 items are written
    problem = check(json.loads(text), ARRAY)                     # jsonschema: too long
    assert problem is not None and problem.startswith("#: "), problem     # the array itself
    assert check(json.loads(text.replace(b"," + item.encode(), b"", 1)), ARRAY) is None
    assert not node_accepts(node, text[:-1] + b",]")


def test_strict_mode_counts_every_item_or_refuses():
    small = {**ARRAY, "maxItems": 3}
    node, relaxed = _node(small, SchemaOptions(mode="strict"))
    assert relaxed == []
    item = json.dumps({"k0": "v0-3"}, separators=(",", ":"))
    assert node_accepts(node, ("[" + ",".join([item] * 3) + "]").encode())
    assert not node_accepts(node, ("[" + ",".join([item] * 4) + "]").encode())
    node, relaxed = _node(ARRAY, SchemaOptions(mode="strict"))
    assert relaxed == []                                          # strict writes all 1000 counts (or the NFA refuses)


def test_small_items_keep_their_count_in_lenient_mode():
    node, relaxed = _node({"type": "array", "items": {"type": "integer"}, "maxItems": 400}, SchemaOptions())
    assert relaxed == []


def test_unfolds_within_counts_uses_and_repeats():
    leaf = alt(lit(b"a"), lit(b"b"))                               # 3 nodes
    assert unfolds_within(leaf, 3) and not unfolds_within(leaf, 2)
    twice = seq(leaf, leaf)                                        # a shared subtree is written once per use
    assert unfolds_within(twice, 7) and not unfolds_within(twice, 6)
    rep = Repeat(leaf, 0, 10)                                      # once per count
    assert unfolds_within(rep, 31) and not unfolds_within(rep, 30)
    loop = Repeat(leaf, 2, None)                                   # a loop: its minimum's copies
    assert unfolds_within(loop, 7) and not unfolds_within(loop, 6)


def test_too_many_states_is_refused_fast(monkeypatch):
    monkeypatch.setattr(layout, "MAX_STATES", 5_000)
    schema = {"type": "array", "maxItems": 30, "items": {"type": "string", "maxLength": 100}}
    with pytest.raises(GrammarBuildError, match="more than 5000 states"):
        build_node_automaton(schema_node(schema, SchemaOptions(mode="strict")))
