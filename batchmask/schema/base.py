"""Shared pieces of the schema front-end: keyword sets, options, errors, the walk's context."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import SchemaError

ANNOTATIONS = frozenset({"description", "title", "examples", "default", "$schema", "$id", "$comment", "deprecated",
                         "readOnly", "writeOnly"})
TYPES = ("string", "integer", "number", "boolean", "null", "array", "object")
KEYWORDS = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "additionalItems"},
    "object": {"properties", "required", "additionalProperties", "unevaluatedProperties", "patternProperties",
               "propertyNames", "minProperties", "maxProperties", "dependentRequired", "dependencies"},
}
GENERAL = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions"}
CONTAINERS = {"$defs", "definitions"}
SUPPORTED = GENERAL.union(*KEYWORDS.values())
# Keywords of JSON Schema (2020-12, and drafts 4-7 as real files spell them) that assert something the subset
# cannot write exactly: refused, naming the keyword and its pointer.
REFUSED = frozenset({"multipleOf", "not", "if", "then", "else",
                     "dependentSchemas", "contains", "minContains",
                     "maxContains", "unevaluatedItems", "contentEncoding", "contentMediaType", "contentSchema",
                     "$dynamicRef", "$dynamicAnchor", "$anchor", "$vocabulary", "$recursiveRef",
                     "$recursiveAnchor",
                     "nullable"})      # OpenAPI 3.0's "or null", which tool schemas written for it carry


def is_annotation(keyword: str) -> bool:
    """A keyword that constrains nothing here: the known annotations (ANNOTATIONS) and every keyword JSON Schema
    does not define (`x-kubernetes-*`, `javaType`, draft 4's `id`, Snowplow's `self`, a typo such as
    `decription`), which the specification says an implementation ignores."""
    return keyword not in SUPPORTED and keyword not in REFUSED


# Ceilings on explicit bounds (the grammar grows linearly with each; maxLength 10^8 took all memory): a larger
# maxLength / maxItems (or pattern repeat) is lowered to the ceiling, which keeps every value valid; a minimum
# above it is refused. LENGTH_CEILING matches --max-string's maximum (batchmask/run/limits.py MAX_STRING).
LENGTH_CEILING = 65536   # characters of one string
ITEMS_CEILING = 1024     # items of one array


@dataclass(frozen=True)
class SchemaOptions:
    """Caps that keep every value bounded (docs/json-schema.md has the table).

    max_string_length   maxLength of a string without one (a larger minLength wins)          256
    int_digits          digits of an integer (or a number's integer part) on a side without a
                        bound: an unbounded integer is -(10^15-1) .. 10^15-1                  15
    fraction_digits     digits after the point in numbers and in times' fractions             6
    exponent_digits     exponent digits of numbers without any bound (bounded: no exponent)  2
    max_items           maxItems of an array without one (a larger minItems wins); entries   16
                        of a map (additionalProperties a schema, no properties)
    max_depth           nesting of arrays and objects inside one value (the value itself is 1) 8
    ref_depth           times one $ref may expand inside itself (recursion is unrolled;
                        past it, optional branches that recurse are left out)                 3
    repeat_cap          repetitions of *, + and {m,} in a pattern (maxLength when given)      16
    any_depth           arrays and maps nested inside a value of any type (a schema `true`,
                        `{}` or without a type; an array without items): 0 scalars only       1
    """
    max_string_length: int = 256
    int_digits: int = 15
    fraction_digits: int = 6
    exponent_digits: int = 2
    max_items: int = 16
    max_depth: int = 8
    ref_depth: int = 3
    repeat_cap: int = 16
    any_depth: int = 1

    def __post_init__(self):
        for name, low in (("max_string_length", 0), ("int_digits", 1), ("fraction_digits", 0),
                          ("exponent_digits", 0), ("max_items", 0), ("max_depth", 1), ("ref_depth", 1),
                          ("repeat_cap", 1), ("any_depth", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"SchemaOptions.{name} must be an integer >= {low}, got {v!r}")


# --- errors and context -----------------------------------------------------------------------------
class Empty(Exception):
    """No value satisfies this (sub)schema; optional places drop it, required ones pass it up."""

    def __init__(self, ptr: str, message: str):
        super().__init__(message)
        self.ptr, self.message = ptr, message


def ptr(base: str, *tokens) -> str:
    """`base` extended by JSON pointer tokens (~ and / escaped)."""
    return base + "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)


@dataclass(frozen=True)
class Ctx:
    root: object
    options: SchemaOptions
    item_sep: bytes
    key_sep: bytes
    where: str
    build: Callable             # build(schema, pointer, ctx) -> Node: the walk itself
    refs: tuple = ()            # the $refs being expanded, outermost first
    depth: int = 0              # arrays/objects entered

    def fail(self, ptr: str, message: str):
        raise SchemaError(f"{self.where}: {ptr}: {message}")


def count(schema: dict, key: str, at: str, ctx: Ctx) -> int | None:
    v = schema.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        ctx.fail(ptr(at, key), f"{key!r} must be a non-negative integer, got {v!r}")
    return v


