"""Keywords beside `anyOf` / `oneOf` / `$ref`, and `allOf`: a conjunction, written as one schema where exact.

    {"type": "string", "anyOf": [{"maxLength": 3}, {"pattern": "^[0-9]+$"}]}
 == {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "string", "pattern": "^[0-9]+$"}]}

A value is valid when it meets the siblings and a branch (for oneOf: exactly one branch; a value that fails the
siblings meets no moved branch either, so exclusivity is unchanged). Within one schema object keywords are a
conjunction, except those that read each other: `properties` / `patternProperties` / `additionalProperties` /
`unevaluatedProperties` (which keys are "additional"), `items` / `prefixItems` / `additionalItems` (which items
are "additional"). So a sibling moves into a branch when the branch does not name the same keyword, or names
it with the same value; `type` lists meet (integer inside number); `required` lists join; bounds take the
tighter (minimum, maxLength, ...); enums intersect; two `properties` join when neither side says which other
keys it admits (each side is then open, so a property meets both sides' schemas: `allOf` of the two); two
`items` schemas likewise. Anything else that meets a keyword of its own group, or a different value of the same
keyword, cannot be written as one object: `merge` returns None, and the caller refuses the schema (lenient
mode: leaves the branch out, `all_of_relaxed`, or the siblings, noting it).

The same merging serves `allOf` (`merged_all_of`, after refs.inline_refs replaced branches that are only a $ref
by their targets) and a $ref with keywords beside it (refs.ref_with_siblings).
"""
from __future__ import annotations

from .base import Ctx, Empty, is_annotation
from .base import ptr as jp
from .json_values import json_equal

GROUPS = ({"properties", "patternProperties", "additionalProperties", "unevaluatedProperties"},
          {"items", "prefixItems", "additionalItems"})


def _types(t) -> list[str]:
    return [t] if isinstance(t, str) else list(t)


def meet_types(a, b) -> list[str]:
    """The types both `type` values admit, in a's order (an integer is a number)."""
    tb = _types(b)
    out = []
    for t in _types(a):
        if t in tb:
            out.append(t)
        elif t == "number" and "integer" in tb:
            out.append("integer")
        elif t == "integer" and "number" in tb:
            out.append("integer")
    return list(dict.fromkeys(out))


TIGHTER = {"minimum": max, "exclusiveMinimum": max, "minLength": max, "minItems": max, "minProperties": max,
           "maximum": min, "exclusiveMaximum": min, "maxLength": min, "maxItems": min, "maxProperties": min}
OPEN_KEYS = ("additionalProperties", "unevaluatedProperties", "patternProperties")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _both(a, b):
    """The conjunction of two subschemas, as one schema."""
    return a if json_equal(a, b) else {"allOf": [a, b]}


def _properties(mine: dict, theirs: dict) -> dict | None:
    """Both sides' `properties` as one object's, where that is exact: neither side says which other keys it
    admits (each is open, as the specification reads it), so a value meets both when each property meets both
    sides' schemas. None otherwise."""
    if any(k in mine or k in theirs for k in OPEN_KEYS):
        return None
    a, b = mine.get("properties", {}), theirs.get("properties", {})
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    out = dict(a)
    for name, sub in b.items():
        out[name] = _both(out[name], sub) if name in out else sub
    return out


def merge(siblings: dict, branch) -> dict | bool | None:
    """`siblings` and `branch` as one schema (False: no value meets both), or None where that is not exact."""
    if branch is True:
        return dict(siblings)
    if branch is False:
        return False
    if not isinstance(branch, dict):
        return None
    own = {k for k in branch if not is_annotation(k)}
    out = dict(branch)
    for group in GROUPS:
        if group & set(siblings) and group & own:
            mine = {k: siblings[k] for k in group if k in siblings}
            theirs = {k: branch[k] for k in group if k in branch}
            if json_equal(mine, theirs):
                continue
            if "properties" in group:
                props = _properties(mine, theirs)
                if props is None:
                    return None
                out["properties"] = props
            elif set(mine) == set(theirs) == {"items"} and isinstance(mine["items"], (dict, bool)) \
                    and isinstance(theirs["items"], (dict, bool)):
                out["items"] = _both(mine["items"], theirs["items"])
            else:
                return None
    for key, value in siblings.items():
        if key not in branch:
            out[key] = value
        elif any(key in g for g in GROUPS):
            continue                                        # merged above, group by group
        elif key == "type":
            met = meet_types(value, branch[key])
            if not met:
                return False
            out[key] = met[0] if len(met) == 1 else met
        elif key == "required" and isinstance(value, list) and isinstance(branch[key], list):
            out[key] = list(dict.fromkeys([*branch[key], *value]))
        elif key in TIGHTER and _number(value) and _number(branch[key]):
            out[key] = TIGHTER[key](value, branch[key])
        elif key == "enum" and isinstance(value, list) and isinstance(branch[key], list):
            out[key] = [v for v in branch[key] if any(json_equal(v, w) for w in value)]
            if not out[key]:
                return False
        elif not json_equal(value, branch[key]):
            return None
    return out


def merged_branches(schema: dict, combinator: str, siblings: list[str]) -> dict | None:
    """{combinator: [each branch with the siblings moved in]} (annotations kept beside it), or None."""
    moved = {k: schema[k] for k in siblings}
    branches = schema[combinator]
    if not isinstance(branches, list):
        return None
    out = []
    for b in branches:
        m = merge(moved, b)
        if m is None:
            return None
        out.append(m)
    return {**{k: v for k, v in schema.items() if k not in moved}, combinator: out}


def redundant(siblings: dict, target) -> bool:
    """Whether `target` (a $ref's schema) already says every sibling: the same keyword with the same value, or a
    `type` of its own the sibling's admits (`{"$ref": ..., "type": "object"}` of an object schema)."""
    if not isinstance(target, dict):
        return False
    for key, value in siblings.items():
        if key not in target:
            return False
        if key == "type":
            own = _types(target["type"])
            if sorted(meet_types(own, value)) != sorted(own):
                return False
        elif not json_equal(value, target[key]):
            return False
    return True


def merged_all_of(schema: dict, siblings: list[str]) -> dict | bool | None:
    """`allOf`'s branches and the keywords beside it as one schema (False: no value meets them all), or None
    where that is not exact (the same rules as `merge`, branch after branch)."""
    branches = schema["allOf"]
    if not isinstance(branches, list) or not branches:
        return None
    out = {k: schema[k] for k in siblings}
    for b in branches:
        if isinstance(b, dict):
            b = {k: v for k, v in b.items() if not is_annotation(k)}
        out = merge(out, b) if out is not False else False
        if out is None:
            return None
    return out


def all_of_relaxed(schema: dict, others: list, ptr: str, ctx: Ctx) -> dict:
    """allOf's branches that merge into one schema, in order, beside its siblings (lenient mode: each branch left
    out is noted; strict mode refuses the first)."""
    out = {k: schema[k] for k in others}
    for i, b in enumerate(schema["allOf"]):
        if isinstance(b, dict):
            b = {k: v for k, v in b.items() if not is_annotation(k)}
        m = merge(out, b)
        if m is False:
            raise Empty(jp(ptr, "allOf", i), "no value meets every branch of allOf")
        if m is None:
            ctx.relax(jp(ptr, "allOf", i), "allOf", f"allOf branch {i} cannot be merged with the ones before it "
                                                     "into one schema")
            continue
        out = m
    return out
