"""Older drafts' spellings -> draft 2020-12, and batchmask's closed objects written as JSON Schema.

Real schemas mix drafts: draft 4's `id` and boolean `exclusiveMinimum`, drafts 4-7's tuple `items` with
`additionalItems`, `definitions`, `dependencies`. The grammar front-end reads those spellings where it meets
them; validation hands the schema to the jsonschema library's draft 2020-12 validator, so it first rewrites
them here (`to_2020_12`), once, into the keywords that validator defines:

    items: [A, B], additionalItems: C   ->  prefixItems: [A, B], items: C
    dependencies: {a: ["b"]}             ->  dependentRequired: {a: ["b"]}
    dependencies: {a: {schema}}          ->  dependentSchemas: {a: {schema}}
    minimum: 3, exclusiveMinimum: true   ->  exclusiveMinimum: 3          (false: minimum stays)
    id / $id below the root               dropped: batchmask resolves every $ref against the root document

`closed(schema)` writes batchmask's object reading (an object holds only its declared properties, as with
OpenAI's strict mode) as `unevaluatedProperties: false` on every value position whose schema declares an object
shape, in place or through allOf/anyOf/oneOf/$ref: `unevaluatedProperties` sees properties declared by those
in-place branches, where `additionalProperties: false` on each branch would refuse the others' properties. A
schema that says `additionalProperties` or `unevaluatedProperties` itself keeps its own reading (a
`patternProperties` key is evaluated, so it stays allowed).
"""
from __future__ import annotations

from urllib.parse import unquote

VALUE_ONE = ("additionalProperties", "items", "additionalItems", "contains", "unevaluatedItems",
             "unevaluatedProperties", "propertyNames")
VALUE_MAP = ("properties", "patternProperties")
INPLACE_ONE = ("not", "if", "then", "else")
INPLACE_LIST = ("allOf", "anyOf", "oneOf")
INPLACE_MAP = ("dependentSchemas", "$defs", "definitions")
OPENERS = ("additionalProperties", "unevaluatedProperties")


def to_2020_12(schema, root: bool = True):
    """`schema` with drafts 4-7 spellings rewritten to draft 2020-12 (module docstring); a new object."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in ("id", "$id", "$schema") and not root:
            continue
        if k in VALUE_ONE or k in INPLACE_ONE:
            out[k] = [to_2020_12(s, False) for s in v] if isinstance(v, list) else to_2020_12(v, False)
        elif k in VALUE_MAP or k in INPLACE_MAP or k == "dependencies":
            out[k] = {n: to_2020_12(s, False) for n, s in v.items()} if isinstance(v, dict) else v
        elif k in INPLACE_LIST or k == "prefixItems":
            out[k] = [to_2020_12(s, False) for s in v] if isinstance(v, list) else v
        else:
            out[k] = v
    out.pop("$schema", None)          # the 2020-12 validator reads every schema; an old URI would pick old rules
    if isinstance(out.get("items"), list):
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    else:
        out.pop("additionalItems", None)                  # without the tuple form it says nothing
    deps = out.pop("dependencies", None)
    if isinstance(deps, dict):
        for name, d in deps.items():
            kind = "dependentRequired" if isinstance(d, list) else "dependentSchemas"
            out.setdefault(kind, {})[name] = d
    for inc, exc in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        flag = out.get(exc)
        if isinstance(flag, bool):
            del out[exc]
            if flag and inc in out:
                out[exc] = out.pop(inc)
    return out


def closed(schema):
    """`schema` (2020-12 spellings) with batchmask's closed objects written out (module docstring)."""
    return _close(schema, schema, value=True)


def _close(s, root, value: bool):
    if not isinstance(s, dict):
        return s
    out = {}
    for k, v in s.items():
        if k in VALUE_ONE:
            out[k] = [_close(x, root, True) for x in v] if isinstance(v, list) else _close(v, root, True)
        elif k in VALUE_MAP:
            out[k] = {n: _close(x, root, True) for n, x in v.items()} if isinstance(v, dict) else v
        elif k == "prefixItems":
            out[k] = [_close(x, root, True) for x in v] if isinstance(v, list) else v
        elif k in INPLACE_ONE:
            out[k] = _close(v, root, False)
        elif k in INPLACE_LIST:
            out[k] = [_close(x, root, False) for x in v] if isinstance(v, list) else v
        elif k in INPLACE_MAP:
            out[k] = {n: _close(x, root, False) for n, x in v.items()} if isinstance(v, dict) else v
        else:
            out[k] = v
    if value and _shape(s, root, set()) is True:
        out["unevaluatedProperties"] = False
    return out


def _shape(s, root, refs: set):
    """True where `s` declares an object shape in place, "open" where it reads its own extra keys, else False."""
    if not isinstance(s, dict):
        return False
    if any(k in s for k in OPENERS):
        return "open"
    t = s.get("type")
    found = "properties" in s or "patternProperties" in s or t == "object" or (isinstance(t, list) and "object" in t)
    branches = [b for k in INPLACE_LIST if isinstance(s.get(k), list) for b in s[k]]
    ref = s.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and ref not in refs:
        target = pointer_target(root, ref) if ref.startswith("#/") or ref in ("#", "#/") else None
        if target is not None:
            refs.add(ref)
            branches.append(target)
    for b in branches:
        got = _shape(b, root, refs)
        if got == "open":
            return "open"
        found = found or got
    return found


def pointer_target(root, ref: str):
    """What the local JSON pointer `ref` (`#/a/b`, a URI fragment: percent-decoded first) names in `root`, or
    None where it names nothing."""
    node = root
    for raw in unquote(ref[2:]).split("/") if ref not in ("#", "#/") else []:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node
