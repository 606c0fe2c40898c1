"""A small JSON Schema validator for the subset batchmask compiles (no runtime dependency).

The grammar already guarantees that a constrained call is valid; this is how any text is
judged independently of it (the free arm of the ablation, `--no-constrain`, a user's own
output). `check(value, schema)` returns None when `value` is valid, else one reason naming the
JSON pointer of the offending value. Values come from `json.loads(..., parse_float=Decimal)`
(see `loads`) so that number bounds are compared exactly.

Meaning, as JSON Schema's: type (and type lists), enum, const, minLength/maxLength (code points),
pattern (`re.search`, as jsonschema does), format date, time, date-time (RFC 3339 as jsonschema's
format checker reads it: no year 0, no leap second 60) and uuid, minimum/maximum/exclusiveMinimum/
exclusiveMaximum, multipleOf, anyOf, oneOf, allOf, not, local $ref ($defs/definitions),
items/prefixItems/minItems/maxItems, properties/required, patternProperties, propertyNames,
minProperties/maxProperties, dependentRequired (and `dependencies` lists). One deliberate
difference, batchmask's: an object holds nothing beyond its declared properties (as with
`additionalProperties: false`), because the grammar generates nothing else; a map (`additionalProperties` a
schema, no `properties`) holds any keys, each value of that schema; a key a pattern of `patternProperties` matches
is allowed, its value of that pattern's schema.
"""
from __future__ import annotations

import calendar
import json
import re
from decimal import Decimal
from urllib.parse import unquote

_NUMBER = (int, float, Decimal)


def loads(text: str):
    """JSON with exact numbers (Decimal for every non-integer literal)."""
    return json.loads(text, parse_float=Decimal)


def check(value, schema, root=None, path: str = "") -> str | None:
    """None if `value` is valid under `schema`, else the first reason found."""
    return _check(value, schema, schema if root is None else root, path, 0)


# --- helpers --------------------------------------------------------------------------------------
def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, str):
        return "string"
    if isinstance(v, _NUMBER):
        return "number"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _is_integer(v) -> bool:
    if isinstance(v, bool) or not isinstance(v, _NUMBER):
        return False
    if isinstance(v, int):
        return True
    return Decimal(v) == Decimal(v).to_integral_value() if _finite(v) else False


def _finite(v) -> bool:
    return Decimal(v).is_finite()


def _dec(v) -> Decimal:
    """A number as the decimal it was written as (a float by its shortest repr: 0.1 is 0.1)."""
    return Decimal(repr(v)) if isinstance(v, float) else Decimal(v)


def _has_type(v, t: str) -> bool:
    if t == "integer":
        return _is_integer(v)
    return _kind(v) == t


def _equal(a, b) -> bool:
    """JSON equality: numbers by value, booleans apart from numbers, containers element-wise."""
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        return False
    if ka == "number":
        return _dec(a) == _dec(b)
    if ka == "array":
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if ka == "object":
        return set(a) == set(b) and all(_equal(a[k], b[k]) for k in a)
    return a == b


def _show(v) -> str:
    try:
        s = json.dumps(v, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _resolve(ref: str, root):
    if not ref.startswith("#"):
        raise ValueError(f"$ref {ref!r}: only local references (#/...) are supported")
    node = root
    for part in [p for p in unquote(ref[1:]).split("/") if p != ""]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise ValueError(f"$ref {ref!r} does not resolve")
    return node


# --- formats (RFC 3339, RFC 4122) ----------------------------------------------------------------
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-](\d{2}):(\d{2}))", re.ASCII)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", re.ASCII)


def _date_ok(s: str) -> bool:
    m = _DATE.fullmatch(s)
    if not m:
        return False
    y, mo, d = (int(x) for x in m.groups())
    return y >= 1 and 1 <= mo <= 12 and 1 <= d <= calendar.monthrange(y, mo)[1]


def _time_ok(s: str) -> bool:
    m = _TIME.fullmatch(s)
    if not m:
        return False
    h, mi, sec = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if m.group(6) is not None and (int(m.group(6)) > 23 or int(m.group(7)) > 59):
        return False
    return h <= 23 and mi <= 59 and sec <= 59


def _datetime_ok(s: str) -> bool:
    for i, c in enumerate(s):
        if c in "Tt":
            return _date_ok(s[:i]) and _time_ok(s[i + 1:])
    return False


FORMATS = {"date": _date_ok, "time": _time_ok, "date-time": _datetime_ok, "uuid": lambda s: bool(_UUID.fullmatch(s))}


# --- the walk ---------------------------------------------------------------------------------------
def _check(v, schema, root, path: str, depth: int) -> str | None:
    where = path or "/"
    if schema is True:
        return None
    if schema is False:
        return f"{where}: no value is allowed here"
    if not isinstance(schema, dict):
        raise ValueError(f"schema at {where} is not an object or a boolean")
    if depth > 200:
        raise ValueError(f"schema at {where}: $ref recursion too deep")
    if "$ref" in schema:
        err = _check(v, _resolve(schema["$ref"], root), root, path, depth + 1)
        if err:
            return err
    t = schema.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        if not any(_has_type(v, x) for x in types):
            return f"{where}: {_show(v)} is not of type {' or '.join(types)}"
    if "const" in schema and not _equal(v, schema["const"]):
        return f"{where}: {_show(v)} is not {_show(schema['const'])}"
    if "enum" in schema and not any(_equal(v, e) for e in schema["enum"]):
        return f"{where}: {_show(v)} is not one of {_show(schema['enum'])}"
    kind = _kind(v)
    err = (_check_string(v, schema, where) if kind == "string" else
           _check_number(v, schema, where) if kind == "number" else
           _check_array(v, schema, root, path, depth) if kind == "array" else
           _check_object(v, schema, root, path, depth) if kind == "object" else None)
    if err:
        return err
    return _check_combinators(v, schema, root, path, depth)


def _check_combinators(v, schema, root, path, depth) -> str | None:
    where = path or "/"
    for sub in schema.get("allOf", []):
        err = _check(v, sub, root, path, depth + 1)
        if err:
            return err
    if "anyOf" in schema and all(_check(v, s, root, path, depth + 1) for s in schema["anyOf"]):
        return f"{where}: {_show(v)} matches none of anyOf"
    if "oneOf" in schema:
        n = sum(_check(v, s, root, path, depth + 1) is None for s in schema["oneOf"])
        if n != 1:
            return f"{where}: {_show(v)} matches {n} branches of oneOf (exactly 1 needed)"
    if "not" in schema and _check(v, schema["not"], root, path, depth + 1) is None:
        return f"{where}: {_show(v)} matches 'not'"
    return None


def _check_string(v: str, schema, where) -> str | None:
    n = len(v)
    if "minLength" in schema and n < schema["minLength"]:
        return f"{where}: string of {n} characters is shorter than minLength {schema['minLength']}"
    if "maxLength" in schema and n > schema["maxLength"]:
        return f"{where}: string of {n} characters is longer than maxLength {schema['maxLength']}"
    if "pattern" in schema and re.search(schema["pattern"], v) is None:
        return f"{where}: {_show(v)} does not match pattern {schema['pattern']!r}"
    fmt = schema.get("format")
    if fmt in FORMATS and not FORMATS[fmt](v):
        return f"{where}: {_show(v)} is not a valid {fmt}"
    return None


def _check_number(v, schema, where) -> str | None:
    if not _finite(v):
        return f"{where}: {v} is not a finite number"
    x = _dec(v)
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if xlo is True:                      # draft 4: a flag on minimum
        xlo, lo = lo, None
    if xhi is True:
        xhi, hi = hi, None
    if isinstance(lo, _NUMBER) and not isinstance(lo, bool) and x < Decimal(str(lo)):
        return f"{where}: {v} is below minimum {lo}"
    if isinstance(hi, _NUMBER) and not isinstance(hi, bool) and x > Decimal(str(hi)):
        return f"{where}: {v} is above maximum {hi}"
    if isinstance(xlo, _NUMBER) and not isinstance(xlo, bool) and x <= Decimal(str(xlo)):
        return f"{where}: {v} is not above exclusiveMinimum {xlo}"
    if isinstance(xhi, _NUMBER) and not isinstance(xhi, bool) and x >= Decimal(str(xhi)):
        return f"{where}: {v} is not below exclusiveMaximum {xhi}"
    m = schema.get("multipleOf")
    if isinstance(m, _NUMBER) and not isinstance(m, bool) and m > 0 and x % Decimal(str(m)) != 0:
        return f"{where}: {v} is not a multiple of {m}"
    return None


def _check_array(v: list, schema, root, path, depth) -> str | None:
    where = path or "/"
    if "minItems" in schema and len(v) < schema["minItems"]:
        return f"{where}: {len(v)} items, fewer than minItems {schema['minItems']}"
    if "maxItems" in schema and len(v) > schema["maxItems"]:
        return f"{where}: {len(v)} items, more than maxItems {schema['maxItems']}"
    prefix = schema.get("prefixItems", [])
    items = schema.get("items", True)
    if isinstance(items, list):          # draft 7's tuple form
        prefix, items = items, schema.get("additionalItems", True)
    for i, x in enumerate(v):
        sub = prefix[i] if i < len(prefix) else items
        err = _check(x, sub, root, f"{path}/{i}", depth + 1)
        if err:
            return err
    return None


def _check_object(v: dict, schema, root, path, depth) -> str | None:
    where = path or "/"
    props = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in v:
            return f"{where}: required property {key!r} is missing"
    if "minProperties" in schema and len(v) < schema["minProperties"]:
        return f"{where}: {len(v)} properties, fewer than minProperties {schema['minProperties']}"
    if "maxProperties" in schema and len(v) > schema["maxProperties"]:
        return f"{where}: {len(v)} properties, more than maxProperties {schema['maxProperties']}"
    for kw in ("dependentRequired", "dependencies"):
        for key, needs in schema.get(kw, {}).items():
            if key in v and isinstance(needs, list) and any(n not in v for n in needs):
                return f"{where}: property {key!r} requires {needs!r} ({kw})"
    t = schema.get("type")
    closed = "properties" in schema or t == "object" or (isinstance(t, list) and "object" in t)
    extra = schema.get("additionalProperties")
    patterns = schema.get("patternProperties", {})
    names = schema.get("propertyNames")
    for key, x in v.items():
        at = f"{path}/{_escape(key)}"
        if names is not None and _check(key, names, root, at, depth + 1):
            return f"{where}: property name {key!r} does not meet propertyNames"
        matched = [p for p in patterns if re.search(p, key)]
        for p in matched:
            err = _check(x, patterns[p], root, at, depth + 1)
            if err:
                return err
        if key in props:
            err = _check(x, props[key], root, at, depth + 1)
        elif matched:
            continue
        elif isinstance(extra, dict) and "properties" not in schema:    # a map: every value of that schema
            err = _check(x, extra, root, at, depth + 1)
        elif closed:            # an object schema (not, say, an anyOf around several) holds its declared keys
            return f"{where}: property {key!r} is not declared"
        else:
            continue
        if err:
            return err
    return None


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
