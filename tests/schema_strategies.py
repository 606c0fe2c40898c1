"""Hypothesis strategies for JSON Schemas of batchmask's supported subset, and instances to judge.

Schemas stay small (a walk over one must take well under a second) but reach every keyword of
the subset: strings with length bounds, enum/const, formats; integers and numbers with inclusive
and exclusive bounds; booleans, null, type lists; arrays (items, prefixItems, min/maxItems);
objects with required and optional properties (in declared order); anyOf.
"""
from __future__ import annotations

import json

from hypothesis import strategies as st

KEYS = st.sampled_from(["a", "b", "id", "x_y", "name", "é", "a b", 'q"t', "k\\"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-300, 300), st.sampled_from([0.5, -2.25, 0.001]),
                    st.text(alphabet='ab "\\\né€😀\x01', max_size=4))
FORMATS = ["date", "time", "date-time", "uuid"]
# Anchored at both ends: an unanchored start does not compile yet (a free JsonStr before a literal), and a free
# side beside another string in an anyOf passes the automaton's limit on strings open side by side. No class
# that excludes '"' or '\\' (llguidance 1.9.1 then still admits them written as escapes).
PATTERNS = ["^[a-c]{1,3}$", "^x+y?$", "^\\d{2}-\\d{2}$", "^(ab|cd)*$", "^[^ab]{0,4}$", "^é.?$", "^\\w\\s[0-9]$"]


@st.composite
def string_schemas(draw):
    s: dict = {"type": "string"}
    kind = draw(st.sampled_from(["plain", "plain", "format", "enum", "const", "pattern", "uncapped"]))
    if kind == "pattern":
        s["pattern"] = draw(st.sampled_from(PATTERNS))
        return s
    if kind == "uncapped":           # the default cap (SchemaOptions.max_string_length) applies
        if draw(st.booleans()):
            s["minLength"] = draw(st.integers(0, 3))
        return s
    if kind == "format":
        s["format"] = draw(st.sampled_from(FORMATS))
        return s
    if kind == "enum":
        s["enum"] = draw(st.lists(st.text(alphabet='ab"\\é\n', max_size=4), min_size=1, max_size=4, unique=True))
        return s
    if kind == "const":
        s["const"] = draw(st.text(alphabet='ab"é\t', max_size=4))
        return s
    lo = draw(st.one_of(st.none(), st.integers(0, 4)))
    hi = draw(st.integers(max(lo or 0, 1), 8))
    if lo is not None:
        s["minLength"] = lo
    s["maxLength"] = hi
    return s


@st.composite
def integer_schemas(draw):
    s: dict = {"type": "integer"}
    lo = draw(st.one_of(st.none(), st.integers(-1200, 1200)))
    hi = draw(st.one_of(st.none(), st.integers(-1200, 1200)))
    if lo is None and hi is None:
        lo = draw(st.integers(-50, 50))
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    if lo is not None:
        s["exclusiveMinimum" if draw(st.booleans()) and (hi is None or lo + 1 < hi) else "minimum"] = lo
    if hi is not None:
        s["exclusiveMaximum" if draw(st.booleans()) and (lo is None or lo + 1 < hi) else "maximum"] = hi
    return s


@st.composite
def number_schemas(draw):
    s: dict = {"type": "number"}
    lo = draw(st.sampled_from([None, 0, -5, 10, 1.5]))
    hi = draw(st.sampled_from([None, 30, 100, 2.75]))
    if lo is not None and hi is not None and lo >= hi:
        hi = None
    if lo is not None:
        s["minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    return s


def leaf_schemas():
    return st.one_of(string_schemas(), integer_schemas(), number_schemas(),
                     st.just({"type": "boolean"}), st.just({"type": "null"}),
                     st.builds(lambda n: {"type": ["string", "null"], "maxLength": n}, st.integers(1, 5)),
                     st.builds(lambda vs: {"enum": vs}, st.lists(SCALARS, min_size=1, max_size=4,
                                                                 unique_by=lambda v: json.dumps(v))),
                     st.builds(lambda v: {"const": v}, SCALARS))


def _array(inner):
    @st.composite
    def arrays(draw):
        s: dict = {"type": "array"}
        if draw(st.booleans()):
            s["prefixItems"] = draw(st.lists(inner, min_size=1, max_size=2))
        s["items"] = draw(inner)
        lo = draw(st.integers(0, 2))
        s["minItems"] = lo
        if draw(st.integers(0, 3)):      # else the default cap (SchemaOptions.max_items) applies
            s["maxItems"] = draw(st.integers(max(lo, 1), 3))
        return s
    return arrays()


def _object(inner):
    @st.composite
    def objects(draw):
        keys = draw(st.lists(KEYS, min_size=0, max_size=3, unique=True))
        props = {k: draw(inner) for k in keys}
        required = [k for k in keys if draw(st.booleans())]
        return {"type": "object", "properties": props, "required": required}
    return objects()


def _nested(max_leaves: int):
    return st.recursive(leaf_schemas(),
                        lambda inner: st.one_of(_array(inner), _object(inner),
                                                st.builds(lambda a, b: {"anyOf": [a, b]}, inner, inner),
                                                st.builds(_one_of, string_schemas(), integer_schemas())),
                        max_leaves=max_leaves)


def schemas(max_leaves: int = 5):
    """Schemas of the subset, nested a few levels; $defs only at the root (where "#/$defs/d" points)."""
    nested = _nested(max_leaves)
    return st.one_of(nested, st.builds(_ref, nested))


def _ref(inner):
    """A local $ref into $defs (not recursive)."""
    return {"$defs": {"d": inner}, "type": "object", "properties": {"p": {"$ref": "#/$defs/d"}}, "required": ["p"]}


def _one_of(a, b):
    """oneOf with branches disjoint by type."""
    return {"oneOf": [a, b]}


def object_schemas(max_leaves: int = 5):
    """A tool's parameters: an object at the top."""
    nested = _nested(max_leaves)
    return st.one_of(_object(nested), st.builds(_ref, nested))


# --- instances ---------------------------------------------------------------------------------
FORMAT_SAMPLES = ["2024-02-29", "2023-02-29", "0000-01-01", "2023-13-01", "1999-12-31", "2020-04-31",
                  "12:00:00Z", "23:59:60Z", "24:00:00Z", "08:30:00.25+05:30", "08:30:00", "08:30:00+24:00",
                  "2020-01-01T00:00:00Z", "2020-01-01t00:00:00z", "2020-01-01 00:00:00Z",
                  "2021-02-29T10:00:00Z", "0000-01-01T00:00:00Z",
                  "123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000",
                  "{123e4567-e89b-12d3-a456-426614174000}", "123E4567-E89B-12D3-A456-42661417400G"]


def json_values():
    leaves = st.one_of(SCALARS, st.sampled_from(FORMAT_SAMPLES), st.integers(-1300, 1300),
                       st.decimals(-40, 120, places=2, allow_nan=False).map(float),
                       st.text(alphabet="abé", max_size=9))
    return st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(KEYS, inner, max_size=3)),
                        max_leaves=8)


# --- reference schemas ---------------------------------------------------------------------------
def closed(schema):
    """The schema with `additionalProperties: false` on every object of declared properties that says nothing of
    others (batchmask's object semantics); `additionalProperties` true or a schema is kept (a map, or keys beside
    declared properties), its values closed in turn."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (closed(v) if k in ("items", "anyOf", "oneOf", "allOf", "prefixItems", "not") else v)
           for k, v in schema.items()}
    for k in ("properties", "patternProperties", "$defs", "definitions"):
        if k in schema:
            out[k] = {p: closed(v) for p, v in schema[k].items()}
    if isinstance(schema.get("additionalProperties"), dict):                    # a map, or keys beside properties
        out["additionalProperties"] = closed(schema["additionalProperties"])
    elif schema.get("additionalProperties") is True:
        pass
    elif schema.get("type") == "object" or "properties" in schema:
        out["additionalProperties"] = False
    return out
