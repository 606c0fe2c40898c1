"""Shared pieces of the schema front-end: keyword sets, options, errors, the walk's context."""
from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar
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
# cannot write exactly. strict mode refuses them, naming the keyword and its pointer; lenient mode (the default)
# compiles without them where RELAXED says how, reports each (Relaxation), and finished values are validated.
REFUSED = frozenset({"multipleOf", "not", "if", "then", "else", "dependentSchemas", "contains", "minContains",
                     "maxContains", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
                     "nullable"})      # OpenAPI 3.0's "or null", which tool schemas written for it carry
# What lenient mode writes instead of each keyword it cannot write exactly ("superset": values the keyword
# would refuse can come out, and validation reports them; otherwise the language only narrows).
SUPERSET, NARROWED = "superset", "narrowed"
RELAXED = {
    "multipleOf": (SUPERSET, "ignored: any number the other keywords allow"),
    "not": (SUPERSET, "ignored: the value is not kept out of the 'not' schema"),
    "if": (SUPERSET, "ignored with 'then'/'else': neither branch is enforced"),
    "then": (SUPERSET, "ignored with 'if'"),
    "else": (SUPERSET, "ignored with 'if'"),
    "minProperties": (SUPERSET, "ignored: fewer properties can be written"),
    "maxProperties": (SUPERSET, "ignored: more properties can be written"),
    "patternProperties": (NARROWED, "keys only it allows are not written (closed objects)"),
    "dependentRequired": (SUPERSET, "ignored: a property can be written without the ones it depends on"),
    "dependentSchemas": (SUPERSET, "ignored: a property's dependent schema is not enforced"),
    "dependencies": (SUPERSET, "ignored: a property can be written without what it depends on"),
    "propertyNames": (SUPERSET, "ignored: keys are not checked against it"),
    "contains": (SUPERSET, "ignored with minContains/maxContains: no item is required to match"),
    "minContains": (SUPERSET, "ignored with 'contains'"),
    "maxContains": (SUPERSET, "ignored with 'contains'"),
    "unevaluatedItems": (SUPERSET, "ignored"),
    "$dynamicRef": (SUPERSET, "written as any JSON value"),
    "$recursiveRef": (SUPERSET, "written as any JSON value"),
    "nullable": (NARROWED, "read as JSON Schema reads it, an annotation: null is not written unless 'type' allows it"),
    "uniqueItems": (SUPERSET, "items are not kept distinct"),
    "maxItems": (SUPERSET, "not counted where its items are too large to write out once per count "
                           "(ITEMS_UNROLL): longer arrays can be written"),
    "oneOf": (SUPERSET, "branches that may overlap are written as anyOf: a value matching two is not refused"),
    "allOf": (SUPERSET, "a branch that cannot be merged with the others is left out"),
    "siblings": (SUPERSET, "keywords beside $ref/anyOf/oneOf that cannot be merged in are left out"),
    "pattern": (SUPERSET, "not written: any string of the allowed length"),
    "format": (SUPERSET, "not written: any string of the allowed length"),
    "unevaluatedProperties": (NARROWED, "only declared properties are written (closed objects)"),
    "$ref": (SUPERSET, "a reference outside the document is written as any JSON value"),
    "additionalProperties": (NARROWED, "keys beside the declared properties are not written: the automaton with "
                                       "them passed its size limits (SchemaOptions.other_keys)"),
}
MODES = ("lenient", "strict")


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
ITEMS_UNROLL = 400_000   # nodes of an array's items (written out: schema/nodes.unfolds_within) times the counts a
                         # maxItems makes, each a copy of the items; as many as nfa.MAX_NFA, so the array alone
                         # would be refused: lenient mode counts no further
FORMAT_BUDGET = 256      # characters of a narrowed format's value (hostname, email, uri) without a maxLength


_OPTIONAL = ("max_string_length", "int_digits", "fraction_digits", "exponent_digits", "max_items", "repeat_cap")


@dataclass(frozen=True)
class SchemaOptions:
    """Caps that keep every value bounded (docs/json-schema.md has the table).

    max_string_length   maxLength of a string without one (a larger minLength wins); None:  None
                        no cap (a value block whose count stops once minLength is met)
    int_digits          digits of an integer (or a number's integer part) on a side without None
                        a bound; None: no cap (a loop of digits)
    fraction_digits     digits after the point in numbers and in times' fractions; None:    None
                        no cap (a time within maxLength: what fits)
    exponent_digits     exponent digits of numbers without any bound (bounded: none);       None
                        None: no cap
    max_items           maxItems of an array without one (a larger minItems wins); entries   None
                        of a map (additionalProperties a schema, no properties); None: no
                        cap (a loop: the token ceiling bounds the value)
    max_depth           nesting of arrays and objects inside one value (the value itself is 1) 32
                        (real schemas nest 10-20 deep)
    recursion_depth     the nesting at which unrolled recursion (a $ref inside itself) stops:   8
                        its optional branches are left out there
    ref_depth           times one $ref may expand inside itself (recursion is unrolled;
                        past it, optional branches that recurse are left out)                 3
    repeat_cap          repetitions of *, + and {m,} in a pattern (maxLength when given);   None
                        None: no cap (a loop; `(a?)*` loops as `a*`)
    any_depth           arrays and maps nested inside a value of any type (a schema `true`,
                        `{}` or without a type; an array without items): 0 scalars only       1
    other_keys          keys beside declared properties where additionalProperties is true  True
                        or a schema (those whose first character starts no declared name);
                        False: none (the compile entry points retry so, reporting it, when
                        the automaton with them passes its size limits)
    open_objects        the specification's reading of an object that says nothing of       False
                        additionalProperties: any other key (as `true`); False: closed, as
                        OpenAI's strict function calling and xgrammar's strict mode read it
    mode                what a keyword the automaton cannot write exactly does (RELAXED):   "lenient"
                        "strict" refuses the schema, naming the keyword and its pointer;
                        "lenient" compiles without it, reports it (Relaxation) and the run
                        validates each finished value against the schema (jsonschema)
    """
    max_string_length: int | None = None
    int_digits: int | None = None
    fraction_digits: int | None = None
    exponent_digits: int | None = None
    max_items: int | None = None
    max_depth: int = 32
    recursion_depth: int = 8
    ref_depth: int = 3
    repeat_cap: int | None = None
    any_depth: int = 1
    other_keys: bool = True
    open_objects: bool = False
    mode: str = "lenient"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"SchemaOptions.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("other_keys", "open_objects"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SchemaOptions.{name} must be True or False, got {getattr(self, name)!r}")
        for name, low in (("max_string_length", 0), ("int_digits", 1), ("fraction_digits", 0),
                          ("exponent_digits", 0), ("max_items", 0), ("max_depth", 1), ("recursion_depth", 1),
                          ("ref_depth", 1), ("repeat_cap", 1), ("any_depth", 0)):
            v, optional = getattr(self, name), name in _OPTIONAL
            if v is None and optional:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                alternative = " or None (no cap)" if optional else ""
                raise ValueError(f"SchemaOptions.{name} must be an integer >= {low}{alternative}, got {v!r}")


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
    relaxed: list = None        # Relaxations of this walk (lenient mode), shared by every context it makes
    built: dict = None          # this walk's subschemas under $refs, built once per context (build._build)

    def fail(self, ptr: str, message: str):
        raise SchemaError(f"{self.where}: {ptr}: {message}")

    def unwritten(self, ptr: str, keyword: str, message: str):
        """`keyword` of the schema at hand cannot be written exactly here: a SchemaError (Unwritten) that names
        it, so that lenient mode can build the schema again without it (types._object)."""
        raise Unwritten(f"{self.where}: {ptr}: {message}", keyword)

    def relax(self, ptr: str, keyword: str, why: str | None = None) -> None:
        """Lenient mode: note that `keyword` at `ptr` is written as RELAXED says. strict mode: refuse it (`why`,
        or that the keyword is not supported)."""
        message = why or f"keyword {keyword!r} is not supported"
        if keyword not in RELAXED:
            self.fail(ptr, message)
        kind, effect = RELAXED[keyword]
        if self.options.mode == "strict":
            self.fail(ptr, f"{message} (strict mode; lenient mode compiles it: {keyword!r} {effect})")
        self.relaxed.append(Relaxation(self.where, ptr, keyword, kind, effect, why))

    def narrow(self, ptr: str, keyword: str) -> None:
        """Note that `keyword` at `ptr` is written narrower, as RELAXED says, in either mode: every value written
        stays valid (what strict mode refuses is a superset)."""
        kind, effect = RELAXED[keyword]
        self.relaxed.append(Relaxation(self.where, ptr, keyword, kind, effect, None, strict_refuses=False))


class Unwritten(SchemaError):
    """A SchemaError for a keyword that cannot be written exactly (not a schema that is wrong): `keyword`."""

    def __init__(self, message: str, keyword: str):
        super().__init__(message)
        self.keyword = keyword


@dataclass(frozen=True)
class Relaxation:
    """One keyword lenient mode did not write exactly: where (the tool), the JSON pointer, the keyword, whether the
    language is a superset (validation reports values outside the schema) or only narrowed, and how."""
    where: str
    ptr: str
    keyword: str
    kind: str                   # SUPERSET or NARROWED
    effect: str
    why: str | None = None      # what strict mode would have said
    strict_refuses: bool = True  # False: a narrowing made in either mode (Ctx.narrow)

    def line(self) -> str:
        mode = "lenient mode; strict refuses it" if self.strict_refuses else "a narrowing, in either mode"
        return f"{self.where}: {self.ptr}: {self.keyword!r} {self.effect} ({mode})"

    def to_json(self) -> dict:
        return {"where": self.where, "pointer": self.ptr, "keyword": self.keyword, "kind": self.kind,
                "effect": self.effect}


def count(schema: dict, key: str, at: str, ctx: Ctx) -> int | None:
    v = schema.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        ctx.fail(ptr(at, key), f"{key!r} must be a non-negative integer, got {v!r}")
    return v




# --- relaxations reported ------------------------------------------------------------------------------------
class LenientWarning(UserWarning):
    """A schema keyword compiled leniently (batchmask.schema.base.RELAXED): said once per keyword per process."""


_COLLECTING: ContextVar[list | None] = ContextVar("batchmask_relaxations", default=None)
_WARNED: set = set()
_WARNED_LOCK = threading.Lock()


@contextmanager
def collect():
    """Gather the Relaxations of every schema compiled inside the block (a grammar's tools): `with collect() as
    got`. The compile entry points (batchmask/api.py) keep them in the grammar's meta."""
    got: list = []
    token = _COLLECTING.set(got)
    try:
        yield got
    finally:
        _COLLECTING.reset(token)


def report(relaxed: list) -> None:
    """Hand a schema's Relaxations to the collector in force, and warn once per keyword not warned of before."""
    sink = _COLLECTING.get()
    if sink is not None:
        sink.extend(relaxed)
    for r in relaxed:
        with _WARNED_LOCK:
            if r.keyword in _WARNED:
                continue
            _WARNED.add(r.keyword)
        warnings.warn(LenientWarning(r.line()), stacklevel=4)
