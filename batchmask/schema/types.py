"""The builders of each JSON type: string, integer, number, boolean, null, array, object (schema/objects.py)."""
from __future__ import annotations

import math
import re
from dataclasses import replace
from fractions import Fraction

from ..grammar.nodes import JsonStr, Node, Repeat
from .base import FORMAT_BUDGET, ITEMS_CEILING, ITEMS_UNROLL, LENGTH_CEILING, RELAXED, Ctx, Empty, Unwritten, count
from .base import ptr as jp
from .json_values import exact_number
from .nodes import alt, lit, seq, unfolds_within
from .numbers import integer_node, integer_step, multiples_node, number_multiples, number_node
from .objects import object_node
from .regex import PatternError, pattern_node
from .strings import DEFINED_FORMATS, FORMATS, format_node


# --- strings ----------------------------------------------------------------------------------------
def _string(schema: dict, ptr: str, ctx: Ctx) -> Node:
    o = ctx.options
    lo = count(schema, "minLength", ptr, ctx) or 0
    hi = count(schema, "maxLength", ptr, ctx)
    if lo > LENGTH_CEILING:
        ctx.fail(jp(ptr, "minLength"), f"minLength {lo} is above the supported maximum {LENGTH_CEILING}")
    given_hi = hi is not None
    if given_hi:
        hi = min(hi, LENGTH_CEILING)        # longer strings stay valid; the grammar cannot hold 10^8 positions
    if hi is None and o.max_string_length is not None:
        hi = max(o.max_string_length, lo)
    if hi is not None and lo > hi:
        raise Empty(jp(ptr, "minLength"), f"minLength {lo} > maxLength {hi}")
    if isinstance(schema.get("format"), str) and schema["format"] not in DEFINED_FORMATS:
        schema = {k: v for k, v in schema.items() if k != "format"}     # a format JSON Schema does not define
    if "format" not in schema and "pattern" not in schema:
        return seq(lit(b'"'), JsonStr(lo, hi), lit(b'"'))
    if "pattern" in schema and not isinstance(schema["pattern"], str):
        ctx.fail(jp(ptr, "pattern"), f"'pattern' must be a string, got {schema['pattern']!r}")
    try:
        body = _shaped(schema, ptr, ctx, lo, hi, given_hi)
    except Unwritten as e:                                # lenient: any string of the length allowed
        if ctx.options.mode == "strict":
            raise
        ctx.relax(jp(ptr, e.keyword), e.keyword, str(e).removeprefix(f"{ctx.where}: ").partition(": ")[2])
        body = JsonStr(lo, hi)
    return seq(lit(b'"'), body, lit(b'"'))


def _shaped(schema: dict, ptr: str, ctx: Ctx, lo: int, hi: int, given_hi: bool) -> Node:
    """The body of a string of a `format` or a `pattern`, within minLength lo and maxLength hi."""
    o = ctx.options
    kw = "pattern" if "pattern" in schema else "format"     # what lenient mode leaves out if it cannot be written
    if "format" in schema and "pattern" in schema:
        ctx.unwritten(jp(ptr, "pattern"), kw, "'pattern' together with 'format' is not supported")
    if "format" in schema:
        name = schema["format"]
        try:
            budget = hi if hi is not None else FORMAT_BUDGET
            built = format_node(name, o.fraction_digits, budget, hi) if isinstance(name, str) else None
        except ValueError as e:
            ctx.unwritten(jp(ptr, "maxLength"), kw, f"format {name!r} cannot be written within maxLength {hi}: {e}")
        if built is None:
            ctx.unwritten(jp(ptr, "format"), kw, f"format {name!r} is not supported (supported: {', '.join(FORMATS)})")
        body, flo, fhi = built
    elif "pattern" in schema:
        pat = schema["pattern"]
        cap = hi if given_hi else o.repeat_cap
        try:
            body, flo, fhi = pattern_node(pat, repeat_cap=None if cap is None else max(cap, 1), free_cap=hi,
                                          bounded=given_hi)
        except PatternError as e:
            if "supported maximum" in str(e):             # past the ceilings no string matches: no superset either
                ctx.fail(jp(ptr, "pattern"), f"pattern {pat!r} {e}")
            ctx.unwritten(jp(ptr, "pattern"), kw, f"pattern {pat!r} {e}")
    if lo > flo or (given_hi and fhi > hi):
        what = "format " + repr(schema["format"]) if "format" in schema else "the pattern"
        limit = f"minLength {lo}" if lo > flo else f"maxLength {hi}"
        ctx.unwritten(jp(ptr, limit.split()[0]), kw, f"{what} matches {flo}..{fhi} characters, not all within {limit}; "
                 "only length limits that every match fits are supported")
    return body



# --- numbers ----------------------------------------------------------------------------------------
def _bound_value(schema: dict, key: str, ptr: str, ctx: Ctx) -> Fraction:
    v = schema[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        ctx.fail(jp(ptr, key), f"{key!r} must be a number, got {v!r}")
    return exact_number(v)


def bounds(schema: dict, ptr: str, ctx: Ctx):
    """((low, exclusive) | None, (high, exclusive) | None), the tighter of inclusive and exclusive forms."""
    out = []
    for inc, exc, tighter in (("minimum", "exclusiveMinimum", max), ("maximum", "exclusiveMaximum", min)):
        found = []
        ex = schema.get(exc)
        if isinstance(ex, bool):                          # draft 4: a flag on minimum / maximum
            if inc in schema:
                found.append((_bound_value(schema, inc, ptr, ctx), ex))
        else:
            if inc in schema:
                found.append((_bound_value(schema, inc, ptr, ctx), False))
            if exc in schema:
                found.append((_bound_value(schema, exc, ptr, ctx), True))
        if not found:
            out.append(None)
            continue
        best = tighter(v for v, _ in found)
        out.append((best, any(e for v, e in found if v == best)))
    return out[0], out[1]


def _reals_between(low, high) -> bool:
    """Whether some real number meets both bounds (each (value, exclusive) or None)."""
    if low is None or high is None:
        return True
    return low[0] < high[0] or (low[0] == high[0] and not (low[1] or high[1]))


def _range_text(low, high) -> str:
    def num(v) -> str:                                 # an exact bound as the schema would write it
        return str(v.numerator) if v.denominator == 1 else repr(float(v))
    lo = "(-inf" if low is None else ("(" if low[1] else "[") + num(low[0])
    hi = "inf)" if high is None else num(high[0]) + (")" if high[1] else "]")
    return f"{lo}, {hi}"


def writes_multiple(schema: dict, ptr: str, ctx: Ctx) -> bool:
    """Whether this schema's multipleOf is written exactly (schema/numbers.py: multiples_node, number_multiples):
    a plain integer or number schema (no combinator beside it) whose step and bounds the construction takes. A
    multipleOf that is not a number above 0 is refused here, in either mode and on any type."""
    k = _multiple(schema, ptr, ctx)
    kind = schema.get("type")
    if kind not in ("integer", "number") or any(key in schema for key in ("$ref", "anyOf", "oneOf", "allOf")):
        return False
    low, high = bounds(schema, ptr, ctx)
    o = ctx.options
    if kind == "integer":
        return multiples_node(low, high, integer_step(k), o.int_digits)[0]
    return number_multiples(low, high, k, o.int_digits, o.fraction_digits)[0]


def _multiple(schema: dict, ptr: str, ctx: Ctx) -> Fraction:
    k = _bound_value(schema, "multipleOf", ptr, ctx)
    if k <= 0:
        ctx.fail(jp(ptr, "multipleOf"), f"'multipleOf' must be greater than 0, got {schema['multipleOf']!r}")
    return k


def _integer(schema: dict, ptr: str, ctx: Ctx) -> Node:
    low, high = bounds(schema, ptr, ctx)
    if "multipleOf" in schema:                            # kept only where writes_multiple said so
        step = integer_step(_multiple(schema, ptr, ctx))
        node = multiples_node(low, high, step, ctx.options.int_digits)[1]
        if node is None:
            raise Empty(ptr, f"no multiple of {step} lies within {_range_text(low, high)}")
        return node
    node = integer_node(low, high, ctx.options.int_digits)
    if node is None:
        raise Empty(ptr, f"no integer lies within {_range_text(low, high)}")
    return node


def _number(schema: dict, ptr: str, ctx: Ctx) -> Node:
    low, high = bounds(schema, ptr, ctx)
    o = ctx.options
    if "multipleOf" in schema:                            # kept only where writes_multiple said so
        k = _multiple(schema, ptr, ctx)
        node = number_multiples(low, high, k, o.int_digits, o.fraction_digits)[1]
        if node is None:
            raise Empty(ptr, f"no multiple of {schema['multipleOf']} lies within {_range_text(low, high)}")
        return node
    node = number_node(low, high, o.int_digits, o.fraction_digits, o.exponent_digits)
    if node is None and _reals_between(low, high):     # numbers lie there, only none the digit caps can write
        caps = " and ".join(f"{n} {what}" for n, what in ((o.int_digits, "integer"), (o.fraction_digits, "fraction"))
                            if n is not None)
        raise Empty(ptr, f"no number of at most {caps} digits lies within {_range_text(low, high)} (raise "
                         f"SchemaOptions.fraction_digits or int_digits, or leave them None, or widen the range)")
    if node is None:
        raise Empty(ptr, f"no number lies within {_range_text(low, high)}")
    return node


# --- containers -------------------------------------------------------------------------------------
def _enter(ptr: str, ctx: Ctx) -> Ctx:
    o = ctx.options
    if ctx.depth + 1 > min(o.max_depth, o.recursion_depth) and any(ctx.refs.count(r) > 1 for r in ctx.refs):
        raise Empty(ptr, f"recursion reaches the nesting limit recursion_depth={min(o.max_depth, o.recursion_depth)}")
    if ctx.depth + 1 > o.max_depth:                        # inside unrolled recursion: stopped above
        ctx.fail(ptr, f"nesting deeper than max_depth={o.max_depth} arrays/objects")
    return replace(ctx, depth=ctx.depth + 1)


def _array(schema: dict, ptr: str, ctx: Ctx) -> Node:
    inner = _enter(ptr, ctx)
    lo = count(schema, "minItems", ptr, ctx) or 0
    hi = count(schema, "maxItems", ptr, ctx)
    if lo > ITEMS_CEILING:
        ctx.fail(jp(ptr, "minItems"), f"minItems {lo} is above the supported maximum {ITEMS_CEILING}")
    if hi is not None:
        hi = min(hi, ITEMS_CEILING)         # shorter arrays stay valid
    unique = schema.get("uniqueItems", False)
    if not isinstance(unique, bool):
        ctx.fail(jp(ptr, "uniqueItems"), f"'uniqueItems' must be true or false, got {unique!r}")
    if unique and (hi is None or hi > 1):
        ctx.relax(jp(ptr, "uniqueItems"), "uniqueItems", "'uniqueItems': true is not supported (unless maxItems <= 1)")
    items, prefix = schema.get("items"), schema.get("prefixItems")
    prefix_key = "prefixItems"
    if isinstance(items, list):                           # drafts 4-7: the tuple form
        if prefix is not None:
            ctx.fail(jp(ptr, "items"), "'items' as a list beside 'prefixItems'")
        prefix, items, prefix_key = items, None, "items"
        extra = schema.get("additionalItems")
        if isinstance(extra, dict):
            items = extra                                 # the items after the tuple: 2020-12's `items`
    if prefix is not None and not isinstance(prefix, list):
        ctx.fail(jp(ptr, prefix_key), f"{prefix_key!r} must be a list of schemas")
    prefix = prefix or []
    if items is None and not prefix:
        items = True                                      # any items (types.any_node)
    heads = []
    for i, sub in enumerate(prefix):
        try:
            heads.append(ctx.build(sub, jp(ptr, prefix_key, i), inner))
        except Empty:
            break                                          # no array is longer than i items
    rest = None
    if items is not None and items is not False and len(heads) == len(prefix):
        try:
            rest = ctx.build(items, jp(ptr, "items"), inner)
        except Empty:
            rest = None
    if hi is not None and rest is not None and _too_many_copies(rest, hi - max(lo, len(heads), 1), ctx):
        ctx.relax(jp(ptr, "maxItems"), "maxItems", f"maxItems {hi} of items this large unfolds past "
                                                   f"{ITEMS_UNROLL} nodes")
        hi = None
    cap = ctx.options.max_items
    longest = len(heads) if rest is None else (hi if hi is not None else None if cap is None else max(cap, lo))
    if hi is not None and longest is not None:
        longest = min(longest, hi)
    if longest is not None and lo > longest:
        raise Empty(jp(ptr, "minItems"), f"no array has {lo}..{longest} items")
    sep = lit(ctx.item_sep)

    def tail(i: int) -> Node:                             # after i items
        options = [lit(b"]")] if i >= lo else []
        if longest is None or i < longest:
            lead = sep if i else lit(b"")
            if i < len(heads):
                options.append(seq(lead, heads[i], tail(i + 1)))
            else:                                          # the items after the prefix: a loop without a cap
                more = max(lo - i, 1)
                options.append(seq(lead, rest, Repeat(seq(sep, rest), more - 1, _less(longest, i + 1)),
                                   lit(b"]")))
        return alt(*options)
    return seq(lit(b"["), tail(0))


def _declare_required(schema: dict, ptr: str) -> dict:
    """A required name `properties` does not declare is a property all the same, of the schema the specification
    gives it: that of each `patternProperties` pattern that matches it (`re.search`, as jsonschema reads them;
    several: all of them), else `additionalProperties` (absent or true: any value; false: no object at all)."""
    props, required = schema.get("properties", {}), schema.get("required", [])
    patterns = schema.get("patternProperties") or {}
    if not isinstance(props, dict) or not isinstance(required, list) or not isinstance(patterns, dict):
        return schema
    missing = [r for r in required if isinstance(r, str) and r not in props]
    if not missing:
        return schema
    extra = schema.get("additionalProperties", True)
    declared = {}
    for name in missing:
        try:
            matching = [sub for pat, sub in patterns.items() if re.search(pat, name)]
        except re.error:
            return schema                           # a pattern Python cannot read: objects.py names it
        if matching:
            declared[name] = matching[0] if len(matching) == 1 else {"allOf": matching}
        elif extra is False:
            raise Empty(jp(ptr, "required"), f"required property {name!r} is not among 'properties', no "
                                              "'patternProperties' pattern matches it and 'additionalProperties' "
                                              "is false")
        else:
            declared[name] = extra
    return {**schema, "properties": {**props, **declared}}


def _object(schema: dict, ptr: str, ctx: Ctx) -> Node:
    """schema/objects.py's object; lenient mode: without each object keyword it cannot write exactly (noted)."""
    inner = _enter(ptr, ctx)
    schema = _declare_required(schema, ptr)
    while True:
        try:
            return object_node(schema, ptr, ctx, inner)
        except Unwritten as e:                            # a keyword it cannot write exactly, named
            keyword = e.keyword
            if ctx.options.mode == "strict" or keyword not in RELAXED or keyword not in schema:
                raise
            why = str(e).removeprefix(f"{ctx.where}: ").partition(": ")[2]
            ctx.relax(jp(ptr, keyword), keyword, why)
            schema = {k: v for k, v in schema.items() if k != keyword}


def any_node(ctx: Ctx, depth: int) -> Node:
    """Any JSON value, within the caps: null, true, false, a number (JSON's syntax, within int_digits,
    fraction_digits and exponent_digits if set), a string (max_string_length), and while `depth` > 0
    (SchemaOptions.any_depth) arrays of up to max_items values and maps of up to max_items free keys whose
    values nest one level less."""
    o = ctx.options
    scalars = [lit(b"null"), lit(b"true"), lit(b"false"),
               number_node(None, None, o.int_digits, o.fraction_digits, o.exponent_digits),
               seq(lit(b'"'), JsonStr(0, o.max_string_length), lit(b'"'))]
    if depth <= 0 or ctx.depth + 1 > o.max_depth or o.max_items == 0:
        return alt(*scalars)
    inner = any_node(replace(ctx, depth=ctx.depth + 1), depth - 1)
    sep, n = lit(ctx.item_sep), o.max_items
    key = seq(lit(b'"'), JsonStr(0, o.max_string_length), lit(b'"'), lit(ctx.key_sep))
    array = seq(lit(b"["), alt(lit(b""), seq(inner, Repeat(seq(sep, inner), 0, _less(n, 1)))), lit(b"]"))
    entry = seq(key, inner)
    obj = seq(lit(b"{"), alt(lit(b""), seq(entry, Repeat(seq(sep, entry), 0, _less(n, 1)))), lit(b"}"))
    return alt(*scalars, array, obj)


def _too_many_copies(item: Node, copies: int, ctx: Ctx) -> bool:
    """Lenient mode: whether `copies` copies of `item` (one per count a maxItems keeps) pass ITEMS_UNROLL nodes.
    Strict mode writes every count, whatever it costs (or the automaton's own limit refuses it)."""
    return ctx.options.mode != "strict" and copies > 1 and not unfolds_within(item, ITEMS_UNROLL // copies)


def _less(cap: int | None, k: int) -> int | None:
    """A Repeat's max `cap - k` (None, no cap, stays None)."""
    return None if cap is None else cap - k


def _any(schema: dict, ptr: str, ctx: Ctx) -> Node:
    return any_node(ctx, ctx.options.any_depth)


TYPE_BUILDERS = {
    "string": _string, "integer": _integer, "number": _number,
    "boolean": lambda s, p, c: alt(lit(b"true"), lit(b"false")),
    "null": lambda s, p, c: lit(b"null"),
    "array": _array, "object": _object,
    "any": _any,                          # no keyword says a type (build._types): any JSON value
}
