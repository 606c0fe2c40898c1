"""JSON Schema -> grammar nodes: the language of one JSON value of a schema, compactly serialised.

`schema_node(schema, options, separators, where)` walks the schema and builds the node tree
(batchmask/grammar/nodes.py) of every value it generates: each generated value validates against the
schema (jsonschema, formats checked), and within the documented caps (SchemaOptions) no valid
value is missing, except where docs/json-schema.md says the language is narrowed (additional
properties and items are never generated; `type` is inferred from the keywords when absent).
Every keyword is supported, ignored as an annotation (ANNOTATIONS, and any keyword JSON Schema does not define:
base.is_annotation), or one the automaton cannot write exactly (base.REFUSED, and combinations the builders
find): strict mode refuses it with a SchemaError that names the tool (`where`) and the JSON pointer of the
keyword; lenient mode writes it as base.RELAXED says and notes it (Ctx.relax; `report` hands the notes to the
compile, which keeps them in CompiledGrammar.relaxations). A keyword that asserts is never silently ignored.

Values serialise as json.dumps(..., ensure_ascii=False, separators=separators) writes them, with one
difference: U+007F is written \\u007f, as every string body here (JsonStr) writes it.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import replace

from ..grammar.nodes import Node
from .base import (
    ANNOTATIONS,
    CONTAINERS,
    KEYWORDS,
    REFUSED,
    SUPPORTED,
    TYPES,
    Ctx,
    Empty,
    SchemaError,
    SchemaOptions,
    is_annotation,
    report,
)
from .base import ptr as jp
from .json_values import (
    check_disjoint,
    check_value,
    equal_key,
    exact_number,
    has_type,
    json_equal,
    json_literal,
    json_type,
)
from .nodes import alt, lit, node_accepts, seq, without_covered_literals
from .refs import inline_refs, reachable_refs, ref_node, ref_with_siblings, resolve
from .siblings import all_of_relaxed, merged_all_of, merged_branches
from .strings import char_node, must_escape
from .types import TYPE_BUILDERS, any_node, bounds, writes_multiple

__all__ = ["ANNOTATIONS", "SchemaError", "SchemaOptions", "canonical_schema", "json_literal", "schema_node"]

# --- the walk ---------------------------------------------------------------------------------------
def _build(schema, ptr: str, ctx: Ctx) -> Node:
    """The node of `schema` at `ptr`; a subschema met before (the same JSON, options, separators and
    depth, no $ref in play) is the node built then: tool sets repeat their parameters' schemas."""
    key = _memo_key(schema, ctx)
    if key is None and ctx.built is not None and isinstance(schema, dict):
        return _build_in_walk(schema, ptr, ctx)
    if key is not None:
        with _BUILT_LOCK:
            got = _BUILT.get(key)
            if got is not None:
                _BUILT.move_to_end(key)
        if got is not None:                               # its relaxations again, at this place
            node, relaxed = got
            _replay(relaxed, ptr, ctx)
            return node
    before = len(ctx.relaxed)
    node = _build_new(schema, ptr, ctx)
    if key is not None:
        relaxed = _relative(ctx.relaxed[before:], ptr)
        with _BUILT_LOCK:
            _BUILT[key] = node, relaxed
            while len(_BUILT) > BUILT_KEPT:
                _BUILT.popitem(last=False)
    return node


def _build_in_walk(schema: dict, ptr: str, ctx: Ctx) -> Node:
    """A subschema the global memo cannot key (it holds or sits under a $ref), built once per walk and context:
    the same schema object, depth, options and separators, and the same view of the $refs being expanded give the
    same node. What a build reads of those $refs is how often each $ref it may expand is on the stack (ref_node,
    inline_refs: only the $refs reachable from the subschema, refs.reachable_refs) and whether any is there twice
    (types._enter: a recursion under way); the key holds just that, so a definition met under different unrelated
    $refs is walked once, not once per stack. The schema object is kept with its node, so its id names it for the
    whole walk."""
    if ctx.refs:
        reach = reachable_refs(schema, ctx)
        counts = tuple(sorted((r, ctx.refs.count(r)) for r in set(ctx.refs) if r in reach))
        recursing = len(set(ctx.refs)) < len(ctx.refs)
    else:
        counts, recursing = (), False
    key = (id(schema), counts, recursing, ctx.depth, ctx.options, ctx.item_sep, ctx.key_sep)
    got = ctx.built.get(key)
    if got is not None:
        _, node, relaxed = got
        _replay(relaxed, ptr, ctx)
        return node
    before = len(ctx.relaxed)
    node = _build_new(schema, ptr, ctx)
    ctx.built[key] = (schema, node, _relative(ctx.relaxed[before:], ptr))
    return node


def _relative(relaxed: list, ptr: str) -> tuple:
    """The relaxations a subschema's build at `ptr` recorded, kept to replay where it is met again: those under
    ptr as (True, with the pointer relative to ptr), those inside $ref targets (False, as they are)."""
    return tuple((True, replace(r, ptr=r.ptr[len(ptr):])) if r.ptr == ptr or r.ptr.startswith(ptr + "/")
                 else (False, r) for r in relaxed)


def _replay(kept: tuple, ptr: str, ctx: Ctx) -> None:
    """`_relative`'s relaxations again, for the subschema met at `ptr` in this walk."""
    ctx.relaxed.extend(replace(r, where=ctx.where, ptr=ptr + r.ptr) if under else r for under, r in kept)


BUILT_KEPT = 4096               # subschema nodes kept (least recently used go first)
_BUILT: OrderedDict = OrderedDict()
_BUILT_LOCK = threading.Lock()  # compiles may run in threads (a server's requests)


def _memo_key(schema, ctx: Ctx):
    """What a subschema's node depends on, or None where it may depend on more (a $ref: the root)."""
    if ctx.refs or not isinstance(schema, dict):
        return None
    try:
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None
    if '"$ref"' in text:
        return None
    return text, ctx.options, ctx.item_sep, ctx.key_sep, ctx.depth


def _build_new(schema, ptr: str, ctx: Ctx) -> Node:
    if schema is True:
        return any_node(ctx, ctx.options.any_depth)
    if schema is False:
        raise Empty(ptr, "the schema false admits no value")
    if not isinstance(schema, dict):
        ctx.fail(ptr, f"a schema must be an object or a boolean, got {type(schema).__name__}")
    schema = _without_relaxed(schema, ptr, ctx)
    assertions = [k for k in schema if k in SUPPORTED and k not in CONTAINERS]
    for combinator in ("$ref", "anyOf", "oneOf", "allOf"):
        if combinator in schema:
            others = [k for k in assertions if k != combinator]
            if others and combinator in ("anyOf", "oneOf"):      # siblings are a conjunction: into each branch
                moved = merged_branches(schema, combinator, others)
                if moved is not None:
                    return _COMBINATORS[combinator](moved, ptr, ctx)
            if combinator == "allOf" and (others or len(schema["allOf"]) > 1):    # one schema, where exact
                schema, ctx = inline_refs(schema, ptr, ctx)
                merged = merged_all_of(schema, others)
                if merged is not None:
                    return _build(merged, ptr, ctx)
                return _build(all_of_relaxed(schema, others, ptr, ctx), ptr, ctx)
            if others and combinator == "$ref":
                return ref_with_siblings(schema, others, ptr, ctx)
            if others:
                ctx.relax(jp(ptr, others[0]), "siblings", f"{others[0]!r} beside {combinator!r} is not supported "
                                                          "(move it into the referenced schema or each branch)")
                schema = {k: v for k, v in schema.items() if k not in others}
            return _COMBINATORS[combinator](schema, ptr, ctx)
    if "enum" in schema or "const" in schema:
        return _literals(schema, ptr, ctx)
    return alt_or_empty([(t, lambda t=t: TYPE_BUILDERS[t](schema, ptr, ctx)) for t in _types(schema, ptr, ctx)],
                        ptr, "no type of the schema admits a value")


def alt_or_empty(options, ptr: str, message: str) -> Node:
    """Alt of the options that admit a value (each a (label, thunk)); Empty when none does."""
    nodes, first_empty = [], None
    for _, thunk in options:
        try:
            nodes.append(thunk())
        except Empty as e:
            first_empty = first_empty or e
    if not nodes:
        raise first_empty or Empty(ptr, message)
    return without_covered_literals(alt(*nodes))


def _without_relaxed(schema: dict, ptr: str, ctx: Ctx) -> dict:
    """`schema` without the keywords it holds of REFUSED (lenient mode: each noted; strict: refused)."""
    found = [k for k in schema if k in REFUSED and not (k == "multipleOf" and writes_multiple(schema, ptr, ctx))]
    if not found:
        return schema
    for k in found:
        ctx.relax(jp(ptr, k), k)
    return {k: v for k, v in schema.items() if k not in found}


def _types(schema: dict, ptr: str, ctx: Ctx) -> list[str]:
    t = schema.get("type")
    if t is None:
        found = [name for name, kws in KEYWORDS.items() if any(k in schema for k in kws)]
        return found or ["any"]                       # nothing says a type: any JSON value (types.any_node)
    names = [t] if isinstance(t, str) else t
    if not isinstance(names, list) or not names:
        ctx.fail(jp(ptr, "type"), f"'type' must be a type name or a non-empty list of them, got {t!r}")
    for i, n in enumerate(names):
        if n not in TYPES:
            ctx.fail(jp(ptr, "type", i) if isinstance(t, list) else jp(ptr, "type"),
                     f"unknown type {n!r} (expected one of {', '.join(TYPES)})")
    if len(set(names)) != len(names):
        ctx.fail(jp(ptr, "type"), f"'type' lists a type twice: {names!r}")
    if "number" in names and "integer" in names:
        names = [n for n in names if n != "integer"]         # every integer is a number
    return names


# --- literals and combinators -----------------------------------------------------------------------
def _literals(schema: dict, ptr: str, ctx: Ctx) -> Node:
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            ctx.fail(jp(ptr, "enum"), "'enum' must be a non-empty list")
        key = "enum"
    else:
        values, key = [schema["const"]], "const"
    if "enum" in schema and "const" in schema:
        values = [v for v in values if json_equal(v, schema["const"])]
    for i, v in enumerate(values):
        try:
            check_value(v)
        except ValueError as e:
            ctx.fail(jp(ptr, key, i) if key == "enum" else jp(ptr, key), str(e))
    rest = {k: v for k, v in schema.items() if k not in ("enum", "const") and not is_annotation(k)
            and k not in CONTAINERS}
    kept, seen, nodes = [], set(), {}
    for v in values:
        if equal_key(v) in seen:
            continue
        seen.add(equal_key(v))
        if "type" in rest:
            types = _types(rest, ptr, ctx)
            if not any(has_type(v, t) for t in types):
                continue
        if set(rest) - {"type"} and not _satisfies(rest, v, ptr, ctx, nodes):
            continue
        kept.append(v)
    if not kept:
        raise Empty(jp(ptr, key), f"no value of {key!r} satisfies the rest of the schema")
    return alt(*(_literal_node(v, ctx) for v in kept))


def _literal_node(value, ctx: Ctx) -> Node:
    """A const/enum value. A string may write each character that must be escaped in any of the forms
    JsonStr writes (\\n or \\u000a/\\u000A): the same value, so as valid (and as llguidance reads it);
    values inside arrays and objects are written one way, json_literal's."""
    if not isinstance(value, str):
        return lit(json_literal(value, (ctx.item_sep.decode(), ctx.key_sep.decode())))
    parts = [lit(b'"')]
    for ch in value:
        parts.append(char_node([(ord(ch), ord(ch))]) if must_escape(ord(ch)) else lit(ch.encode("utf-8")))
    parts.append(lit(b'"'))
    return seq(*parts)


def _satisfies(rest: dict, value, ptr: str, ctx: Ctx, nodes: dict) -> bool:
    """Does `value` meet the sibling keywords of an enum/const that apply to its type (maxLength says
    nothing of a number)? Bounds are checked on the number itself; the rest by matching its literal
    against the node of those keywords, built with the caps lifted; arrays and objects are refused."""
    kind = {"integer": "number", "number": "number", "string": "string", "array": "array",
            "object": "object"}.get(json_type(value))
    applicable = {k: v for k, v in rest.items() if kind is not None and k in KEYWORDS[kind]}
    if not applicable:
        return True
    if kind in ("array", "object"):
        ctx.fail(jp(ptr, next(iter(applicable))), f"an enum/const {kind} beside {kind} keywords "
                 f"({', '.join(applicable)}) is not supported: list only the values that fit")
    if kind == "number":
        low, high = bounds(applicable, ptr, ctx)
        x = exact_number(value)
        return ((low is None or (x > low[0] if low[1] else x >= low[0]))
                and (high is None or (x < high[0] if high[1] else x <= high[0])))
    if kind not in nodes:                                  # one node per kind, shared by the values
        wide = replace(ctx, options=replace(ctx.options, max_string_length=None, max_items=None,
                                            repeat_cap=None))
        try:
            nodes[kind] = _build(dict(applicable, type=kind), ptr, wide)
        except Empty:
            nodes[kind] = None
    node = nodes[kind]
    return node is not None and node_accepts(node, json_literal(value, (ctx.item_sep.decode(),
                                                                         ctx.key_sep.decode())))


def _branches(schema: dict, key: str, ptr: str, ctx: Ctx) -> list:
    branches = schema[key]
    if not isinstance(branches, list) or not branches:
        ctx.fail(jp(ptr, key), f"{key!r} must be a non-empty list of schemas")
    return branches


def _any_of(schema: dict, ptr: str, ctx: Ctx) -> Node:
    branches = _branches(schema, "anyOf", ptr, ctx)
    return alt_or_empty([(i, lambda i=i, b=b: _build(b, jp(ptr, "anyOf", i), ctx)) for i, b in enumerate(branches)],
                        jp(ptr, "anyOf"), "no branch of anyOf admits a value")


def _one_of(schema: dict, ptr: str, ctx: Ctx) -> Node:
    branches = _branches(schema, "oneOf", ptr, ctx)

    def overlap(where: str, message: str):
        ctx.relax(where, "oneOf", message)
        raise _Overlap

    try:
        check_disjoint(branches, jp(ptr, "oneOf"), overlap, lambda ref: resolve(ref, jp(ptr, "oneOf"), ctx))
    except _Overlap:
        pass                                              # lenient: written as anyOf (noted by ctx.relax)
    return alt_or_empty([(i, lambda i=i, b=b: _build(b, jp(ptr, "oneOf", i), ctx)) for i, b in enumerate(branches)],
                        jp(ptr, "oneOf"), "no branch of oneOf admits a value")


class _Overlap(Exception):
    """oneOf branches that may overlap, in lenient mode: stop checking, write them as anyOf."""


def _all_of(schema: dict, ptr: str, ctx: Ctx) -> Node:
    branches = _branches(schema, "allOf", ptr, ctx)
    real = [i for i, b in enumerate(branches)
            if not (isinstance(b, dict) and all(is_annotation(k) for k in b)) and b is not True]
    if not real:
        return any_node(ctx, ctx.options.any_depth)      # annotations only: any value
    return _build(branches[real[0]], jp(ptr, "allOf", real[0]), ctx)


_COMBINATORS = {"$ref": ref_node, "anyOf": _any_of, "oneOf": _one_of, "allOf": _all_of}


# --- entry points -----------------------------------------------------------------------------------
def _check_separators(separators, where: str) -> tuple[bytes, bytes]:
    ok = (isinstance(separators, (tuple, list)) and len(separators) == 2 and all(isinstance(s, str) for s in separators)
          and separators[0].strip(" \t\n\r") == "," and separators[1].strip(" \t\n\r") == ":")
    if not ok:
        raise SchemaError(f"{where}: separators must be (item, key) strings: ',' and ':' with optional JSON "
                          f"whitespace around them, got {separators!r}")
    return separators[0].encode(), separators[1].encode()


def schema_node(schema, options: SchemaOptions | None = None, separators: tuple[str, str] = (",", ":"),
                where: str = "<schema>") -> Node:
    """The node of one JSON value of `schema` (module docstring); SchemaError names `where` and a pointer."""
    options = options or SchemaOptions()
    item_sep, key_sep = _check_separators(separators, where)
    ctx = Ctx(schema, options, item_sep, key_sep, where, _build, relaxed=[], built={})
    try:
        node = _build(schema, "#", ctx)
    except Empty as e:
        raise SchemaError(f"{where}: {e.ptr}: no value satisfies the schema: {e.message}") from None
    except RecursionError:
        raise SchemaError(f"{where}: #: the schema nests too deeply to walk") from None
    report(ctx.relaxed)
    return node


def canonical_schema(schema):
    """`schema` without annotations at schema positions (key order kept: property order matters)."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if is_annotation(k):
            continue
        if k in ("properties", "patternProperties", "$defs", "definitions") and isinstance(v, dict):
            v = {name: canonical_schema(s) for name, s in v.items()}
        elif k in ("items", "additionalProperties", "additionalItems", "unevaluatedProperties", "not",
                   "propertyNames"):
            v = [canonical_schema(s) for s in v] if isinstance(v, list) else canonical_schema(v)
        elif k in ("prefixItems", "anyOf", "oneOf", "allOf") and isinstance(v, list):
            v = [canonical_schema(s) for s in v]
        out[k] = v
    return out
