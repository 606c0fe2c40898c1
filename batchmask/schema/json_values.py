"""JSON values inside schemas: checks, literals, JSON Schema's equality and types, oneOf disjointness."""
from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction

__all__ = ["check_disjoint", "check_value", "equal_key", "exact_number", "has_type", "integer_literal", "json_equal",
           "json_literal", "json_type"]


def integer_literal(text: str) -> int | Decimal:
    """A JSON integer literal (json.loads' parse_int): an int, or an integral Decimal past Python's int conversion
    limit (4300 digits), where int() raises."""
    return int(text) if len(text) < 4300 else Decimal(text)


def check_value(value, path: str = "") -> None:
    """Raise ValueError (naming where inside `value`) unless `value` is a JSON value that UTF-8 can hold."""
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path or 'value'}: {value!r} is not a JSON number")
        return
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{path or 'value'}: string holds a lone surrogate") from None
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_value(v, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{path or 'value'}: object key {k!r} is not a string")
            check_value(k, f"{path}.key")
            check_value(v, f"{path}.{k}")
        return
    raise ValueError(f"{path or 'value'}: {type(value).__name__} is not a JSON value")


def json_literal(value, separators: tuple[str, str] = (",", ":")) -> bytes:
    """`value` serialised (json.dumps, ensure_ascii=False, these separators; U+007F as \\u007f), UTF-8."""
    check_value(value)
    text = json.dumps(value, ensure_ascii=False, separators=tuple(separators), allow_nan=False)
    return text.replace("\x7f", "\\u007f").encode("utf-8")     # DEL only ever occurs inside strings


def exact_number(v) -> Fraction:
    """A JSON number's exact value; a float is read as the decimal it was written as (its shortest repr),
    so "minimum": 0.1 admits the value 0.1."""
    return Fraction(repr(v)) if isinstance(v, float) else Fraction(v)


def json_type(v) -> str:
    """The narrowest JSON Schema type of a value (1.0 is an integer, as jsonschema reads it)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    return {str: "string", list: "array", tuple: "array", dict: "object"}[type(v)]


def has_type(v, t: str) -> bool:
    vt = json_type(v)
    return vt == t or (t == "number" and vt == "integer")


def json_equal(a, b) -> bool:
    """Equality as JSON Schema means it: 1 == 1.0, but true != 1."""
    ta, tb = json_type(a), json_type(b)
    if {ta, tb} <= {"integer", "number"}:
        return a == b
    if ta != tb:
        return False
    if ta == "array":
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if ta == "object":
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return a == b


def equal_key(v):
    """A hashable key equal for values JSON Schema calls equal (json_equal)."""
    t = json_type(v)
    if t in ("integer", "number"):
        return ("number", exact_number(v))
    if t == "array":
        return ("array", tuple(equal_key(x) for x in v))
    if t == "object":
        return ("object", frozenset((k, equal_key(x)) for k, x in v.items()))
    return (t, v)


# --- oneOf ------------------------------------------------------------------------------------------
def _signature(s, resolve, seen: tuple):
    """What a schema can accept at most: ("values", [...]), ("types", {...}) or None (anything)."""
    if s is False:
        return ("values", [])
    if not isinstance(s, dict):
        return None
    if "$ref" in s:
        ref = s["$ref"]
        return None if ref in seen else _signature(resolve(ref), resolve, seen + (ref,))
    if "allOf" in s and isinstance(s["allOf"], list) and len(s["allOf"]) == 1:
        return _signature(s["allOf"][0], resolve, seen)
    for key in ("anyOf", "oneOf"):
        if key in s and isinstance(s[key], list):
            sigs = [_signature(b, resolve, seen) for b in s[key]]
            if any(g is None for g in sigs):
                return None
            if all(g[0] == "values" for g in sigs):
                return ("values", [v for g in sigs for v in g[1]])
            return ("types", set().union(*(g[1] if g[0] == "types" else {json_type(v) for v in g[1]}
                                           for g in sigs)))
    if "const" in s:
        return ("values", [s["const"]])
    if "enum" in s and isinstance(s["enum"], list):
        return ("values", list(s["enum"]))
    t = s.get("type")
    if isinstance(t, str):
        return ("types", {t})
    if isinstance(t, list):
        return ("types", set(t))
    return None


def _only_objects_meet(a, b) -> bool:
    """Two type signatures whose only shared type is object."""
    if a[0] != "types" or b[0] != "types":
        return False
    return all(not _types_meet(t, u) or t == u == "object" for t in a[1] for u in b[1])


def _object_schema(s, resolve, seen=()):
    """The object schema a branch is (through a $ref or a one-branch allOf), or None."""
    while isinstance(s, dict):
        if "$ref" in s and len(s) == 1 and s["$ref"] not in seen:
            seen += (s["$ref"],)
            s = resolve(s["$ref"])
        elif "allOf" in s and isinstance(s["allOf"], list) and len(s["allOf"]) == 1 and len(s) == 1:
            s = s["allOf"][0]
        else:
            break
    if not isinstance(s, dict) or any(k in s for k in ("$ref", "anyOf", "oneOf", "allOf", "not", "if")):
        return None
    return s


def _objects_apart(a, b, resolve) -> bool:
    """Two object branches no object satisfies both of: a property both require whose schemas share no value
    (a discriminator: `"kind": {"const": "x"}` against `"y"`), or a property one requires that the other, closed by
    an explicit `additionalProperties: false` and without patternProperties, does not declare."""
    a, b = _object_schema(a, resolve), _object_schema(b, resolve)
    if a is None or b is None:
        return False
    props = [x.get("properties") if isinstance(x.get("properties"), dict) else {} for x in (a, b)]
    reqs = [set(r for r in x.get("required", []) if isinstance(r, str)) if isinstance(x.get("required"), list)
            else set() for x in (a, b)]
    for k in reqs[0] & reqs[1]:
        if k in props[0] and k in props[1]:
            ga, gb = _signature(props[0][k], resolve, ()), _signature(props[1][k], resolve, ())
            if ga is not None and gb is not None and _overlap(ga, gb) is None:
                return True
    for y, py, rx in ((b, props[1], reqs[0]), (a, props[0], reqs[1])):
        closed = y.get("additionalProperties") is False and not y.get("patternProperties") \
            and "unevaluatedProperties" not in y
        if closed and any(k not in py for k in rx):
            return True
    return False


def _types_meet(t: str, u: str) -> bool:
    return t == u or {t, u} == {"integer", "number"}


def _overlap(a, b) -> str | None:
    """Why two signatures may share a value, or None when they cannot."""
    if a[0] == "types" and b[0] == "types":
        for t in sorted(a[1]):
            for u in sorted(b[1]):
                if _types_meet(t, u):
                    return f"both admit {t if t == u else 'integers'}"
        return None
    if a[0] == "values" and b[0] == "values":
        for v in a[1]:
            if any(json_equal(v, w) for w in b[1]):
                return f"both admit {json.dumps(v)}"
        return None
    values, types = (a[1], b[1]) if a[0] == "values" else (b[1], a[1])
    for v in values:
        if any(has_type(v, t) for t in types):
            return f"both admit {json.dumps(v)}"
    return None


def check_disjoint(branches: list, ptr: str, fail, resolve) -> None:
    """Refuse (fail(pointer, message)) a oneOf whose branches might both match one value.

    The check is by JSON type (declared `type`, or the values of enum/const; integer meets number) and
    by value: a sound over-approximation of each branch's language, so an accepted oneOf means anyOf.
    """
    sigs = []
    for i, b in enumerate(branches):
        g = _signature(b, resolve, ())
        if g is None:
            fail(f"{ptr}/{i}", "oneOf is supported only when its branches are disjoint by type or value; "
                               "this branch has no 'type', enum or const to tell")
        sigs.append(g)
    for i in range(len(sigs)):
        for j in range(i):
            why = _overlap(sigs[j], sigs[i])
            if why and _only_objects_meet(sigs[j], sigs[i]) and _objects_apart(branches[j], branches[i], resolve):
                why = None
            if why:
                fail(f"{ptr}/{i}", f"oneOf branches {j} and {i} may both match ({why}); only disjoint branches "
                                   "are supported (use anyOf if either may match)")
