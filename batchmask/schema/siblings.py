"""Keywords beside `anyOf` / `oneOf`: a conjunction, moved into each branch where that is exact.

    {"type": "string", "anyOf": [{"maxLength": 3}, {"pattern": "^[0-9]+$"}]}
 == {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "string", "pattern": "^[0-9]+$"}]}

A value is valid when it meets the siblings and a branch (for oneOf: exactly one branch; a value that fails the
siblings meets no moved branch either, so exclusivity is unchanged). Within one schema object keywords are a
conjunction, except those that read each other: `properties` / `patternProperties` / `additionalProperties` /
`unevaluatedProperties` (which keys are "additional"), `items` / `prefixItems` / `additionalItems` (which items
are "additional"). So a sibling moves into a branch when the branch does not name the same keyword, or names it
with the same value; `type` lists meet (integer inside number); `required` lists join. A sibling that would meet a
branch's keyword of its own group, or a different value of the same keyword, cannot be written as one object:
`merged_branches` then returns None and the caller refuses the schema as before.
"""
from __future__ import annotations

from .base import is_annotation
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


def merge(siblings: dict, branch) -> dict | bool | None:
    """`siblings` and `branch` as one schema (False: no value meets both), or None where that is not exact."""
    if branch is True:
        return dict(siblings)
    if branch is False:
        return False
    if not isinstance(branch, dict):
        return None
    own = {k for k in branch if not is_annotation(k)}
    for group in GROUPS:
        if group & set(siblings) and group & own:
            mine = {k: siblings.get(k) for k in group}
            theirs = {k: branch.get(k) for k in group}
            if not json_equal(mine, theirs):
                return None
    out = dict(branch)
    for key, value in siblings.items():
        if key not in branch:
            out[key] = value
        elif key == "type":
            met = meet_types(value, branch[key])
            if not met:
                return False
            out[key] = met[0] if len(met) == 1 else met
        elif key == "required" and isinstance(value, list) and isinstance(branch[key], list):
            out[key] = list(dict.fromkeys([*branch[key], *value]))
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
