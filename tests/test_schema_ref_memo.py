"""The walk's memo of subschemas under $refs (schema/build.py _build_in_walk) keys on the $refs a subschema can reach
(schema/refs.py reachable_refs), not on the whole stack: checked against the walk without that memo, which builds
every subschema at every place it is met. The node trees and the relaxations must be equal, on schemas where the
same definitions are met under different unrelated $refs, with recursion, anchors, allOf of $refs, and ref_depth
and recursion limits reached at different depths; and on the JSON Schema Test Suite's $ref schemas."""
from __future__ import annotations

import json

import pytest
from data_paths import SCHEMA_SUITE

from batchmask.schema import build
from batchmask.schema.base import Ctx, Empty, SchemaError, SchemaOptions
from batchmask.schema.refs import reachable_refs


def walk(schema, options: SchemaOptions, memo: bool):
    """(node, relaxations) of a walk with the in-walk memo (as schema_node runs) or without it; Empty as a value."""
    ctx = Ctx(schema, options, b",", b":", "<schema>", build._build, relaxed=[], built={} if memo else None)
    try:
        node = build._build(schema, "#", ctx)
    except Empty as e:
        return ("empty", e.ptr, e.message), []
    except SchemaError as e:                 # a limit passed (max_depth): the same refusal either way
        return ("refused", str(e)), []
    return node, [(r.ptr, r.keyword) for r in ctx.relaxed]


SHARED = {"$defs": {
    "leaf": {"type": "object", "properties": {"v": {"type": "integer"}, "tag": {"$ref": "#/$defs/tag"}}},
    "tag": {"enum": ["a", "b"]},
    "left": {"type": "object", "properties": {"x": {"$ref": "#/$defs/leaf"}, "y": {"$ref": "#/$defs/right"}}},
    "right": {"type": "object", "properties": {"z": {"$ref": "#/$defs/leaf"}}},
    "tree": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3},
                                              "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"},
                                                       "maxItems": 2},
                                              "leaf": {"$ref": "#/$defs/leaf"}}},
    "a": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "null"}]},
    "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "maxItems": 2},
    "named": {"$anchor": "nm", "type": "object", "properties": {"p": {"$ref": "#/$defs/leaf"}}},
    "both": {"allOf": [{"$ref": "#/$defs/leaf"}, {"$ref": "#/$defs/named"}]},
    "pt": {"type": "object", "properties": {"x": {"type": "integer"}}},
    "rec": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"r": {"$ref": "#/$defs/rec"},
                                                                          "p": {"$ref": "#/$defs/pt"}}}]},
}}


def with_root(props: dict) -> dict:
    return {**SHARED, "type": "object", "properties": props}


CASES = [
    with_root({"l": {"$ref": "#/$defs/left"}, "r": {"$ref": "#/$defs/right"}, "f": {"$ref": "#/$defs/leaf"}}),
    with_root({"t": {"$ref": "#/$defs/tree"}, "l": {"$ref": "#/$defs/left"}}),
    with_root({"a": {"$ref": "#/$defs/a"}, "t": {"$ref": "#/$defs/tree"}}),
    with_root({"n": {"$ref": "#nm"}, "b": {"$ref": "#/$defs/both"}, "l": {"$ref": "#/$defs/left"}}),
    with_root({"deep": {"type": "array", "items": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
               "t": {"$ref": "#/$defs/tree"}}),
    # `pt` entered at one depth both outside any recursion (w.w2.p, built first) and inside one of `rec` (a.r.p): the
    # recursion limit cuts only the second, so it must not be handed the first's build
    with_root({"w": {"type": "object", "properties": {"w2": {"type": "object", "properties": {
                   "p": {"$ref": "#/$defs/pt"}}}}},
               "a": {"$ref": "#/$defs/rec"}}),
]
OPTIONS = [SchemaOptions(), SchemaOptions(ref_depth=1), SchemaOptions(ref_depth=2, recursion_depth=3),
           SchemaOptions(max_depth=4)]


@pytest.mark.parametrize("options", OPTIONS, ids=["default", "ref_depth1", "recursion3", "max_depth4"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_memo_gives_the_walk_without_it(case, options):
    assert walk(CASES[case], options, True) == walk(CASES[case], options, False)


def test_the_memo_is_used_across_unrelated_refs():
    """The point of keying on reachable $refs: `leaf` is met at depth 2 under left's stack and under right's, and at
    depth 3 under both; keyed on the whole stack it was built once per (stack, depth), now once per depth."""
    calls = []
    real = build._build_new

    def counting(schema, ptr, ctx):
        if schema is SHARED["$defs"]["leaf"]:
            calls.append((ctx.depth, ctx.refs))
        return real(schema, ptr, ctx)
    build._build_new = counting
    try:
        walk(CASES[0], SchemaOptions(), False)
        places = set(calls)
        calls.clear()
        walk(CASES[0], SchemaOptions(), True)
    finally:
        build._build_new = real
    assert len(calls) == len({d for d, _ in places}) == 3 < len(places) == 4


def test_reachable_refs_follow_targets_and_anchors():
    ctx = Ctx(CASES[3], SchemaOptions(), b",", b":", "<schema>", build._build, relaxed=[], built={})
    defs = CASES[3]["$defs"]
    assert reachable_refs(defs["left"], ctx) == {"#/$defs/leaf", "#/$defs/right", "#/$defs/tag"}
    assert reachable_refs(defs["tag"], ctx) == frozenset()
    assert reachable_refs({"$ref": "#nm"}, ctx) == {"#nm", "#/$defs/leaf", "#/$defs/tag"}
    assert "#/$defs/tree" in reachable_refs(defs["tree"], ctx)                 # itself, through its items


def suite_ref_schemas():
    out = []
    for path in sorted((SCHEMA_SUITE / "draft2020-12").glob("*.json")):
        for group in json.loads(path.read_text()):
            if '"$ref"' in json.dumps(group["schema"]):
                out.append(pytest.param(group["schema"], id=f"{path.stem}:{group['description'][:40]}"))
    return out


@pytest.mark.parametrize("schema", suite_ref_schemas())
def test_suite_ref_schemas(schema):
    options = SchemaOptions()
    try:
        with_memo = walk(schema, options, True)
    except Exception as e:                   # refused (strict keywords, remote refs): refused alike without the memo
        with pytest.raises(type(e)):
            walk(schema, options, False)
        return
    assert with_memo == walk(schema, options, False)
